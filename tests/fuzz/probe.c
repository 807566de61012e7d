/* Configure-time probe: can this clang link a libFuzzer + ASan + UBSan program? */
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    (void)data;
    (void)n;
    return 0;
}
