/* The status table: names, texts, stable values, and the per-thread message. */
#include <string.h>
#include <zero/status.h>
#include <zero/version.h>
#include <zero/dtype.h>
#include "check.h"

int main(void)
{
    CHECK(ZERO_OK == 0);
    CHECK(ZERO_TIMEOUT == 3);
    CHECK(strcmp(zero_status_name(ZERO_TIMEOUT), "ZERO_TIMEOUT") == 0);
    CHECK(strcmp(zero_status_name((zero_status)999), "ZERO_UNKNOWN_STATUS") == 0);
    CHECK(strcmp(zero_strerror(ZERO_OK), "success") == 0);
    CHECK(strlen(zero_strerror(ZERO_CORRUPT)) > 0);
    CHECK(zero_version() == ZERO_VERSION);
    CHECK(zero_version_string()[0] == '0' + ZERO_VERSION_MAJOR);
    CHECK(zero_dtype_size(ZERO_BF16) == 2 && zero_dtype_size(ZERO_I64) == 8);
    CHECK(zero_dtype_size((zero_dtype)42) == 0);
    CHECK(strcmp(zero_dtype_name(ZERO_BF16), "bf16") == 0);
    CHECK(zero_last_error() != NULL);
    return check_exit();
}
