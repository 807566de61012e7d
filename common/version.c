#include <zero/version.h>

#define ZERO_STR_(x) #x
#define ZERO_STR(x) ZERO_STR_(x)

int zero_version(void)
{
    return ZERO_VERSION;
}

const char *zero_version_string(void)
{
    return ZERO_STR(ZERO_VERSION_MAJOR) "." ZERO_STR(ZERO_VERSION_MINOR) "." ZERO_STR(ZERO_VERSION_PATCH);
}
