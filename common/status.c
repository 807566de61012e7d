/* Names and descriptions of status codes, generated from ZERO_STATUS_MAP. */
#include <zero/status.h>

const char *zero_status_name(zero_status status)
{
    switch (status) {
#define ZERO_STATUS_NAME_(name, value, text) case ZERO_##name: return "ZERO_" #name;
        ZERO_STATUS_MAP(ZERO_STATUS_NAME_)
#undef ZERO_STATUS_NAME_
    }
    return "ZERO_UNKNOWN_STATUS";
}

const char *zero_strerror(zero_status status)
{
    switch (status) {
#define ZERO_STATUS_TEXT_(name, value, text) case ZERO_##name: return text;
        ZERO_STATUS_MAP(ZERO_STATUS_TEXT_)
#undef ZERO_STATUS_TEXT_
    }
    return "unknown status code";
}
