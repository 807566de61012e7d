/* Finding and loading libzero-cuda (cuda_module.h): once per process, on the
 * first use of CUDA. A failure is kept and reported to every later caller
 * the same way: ZERO_UNSUPPORTED with each file tried and dlopen's reason
 * (a missing module, or a module whose libcudart / libnccl is missing). */
#include "device/cuda_module.h"

#if ZERO_HAVE_CUDA

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zero/version.h>

#include "common/error.h"

#define STR_(x) #x
#define STR(x) STR_(x)
#define MODULE_FILE "libzero-cuda.so." STR(ZERO_VERSION_MAJOR)

const zero_cuda_module *zero_cu;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[ZERO_ERRMSG_MAX]; /* why the load failed ("" when it did not) */

/* Append "path: reason" to load_error. */
static void note(const char *path, const char *reason)
{
    size_t len = strlen(load_error);
    snprintf(load_error + len, sizeof load_error - len, "%s%s: %s", len ? "; " : "", path, reason);
}

/* dlopen `path` and check it is this libzero's module. 1 on success. */
static int try_load(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        note(path, why ? why : "dlopen failed");
        return 0;
    }
    const zero_cuda_module *m = dlsym(h, ZERO_CUDA_MODULE_SYMBOL);
    char why[128];
    if (!m)
        snprintf(why, sizeof why, "no symbol %s: not a libzero CUDA module", ZERO_CUDA_MODULE_SYMBOL);
    else if (m->version != ZERO_VERSION || m->size != sizeof *m)
        snprintf(why, sizeof why, "built for libzero %d.%d.%d, this is %s", m->version / 10000,
                 m->version / 100 % 100, m->version % 100, zero_version_string());
    else {
        zero_cu = m;
        return 1; /* kept loaded: its kernels stay registered with the runtime */
    }
    note(path, why);
    dlclose(h);
    return 0;
}

/* The directory of the libzero.so this code runs in ("" if unknown). */
static void own_dir(char *buf, size_t len)
{
    Dl_info info;
    buf[0] = '\0';
    if (!dladdr((void *)zero_cuda_load, &info) || !info.dli_fname) return;
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash) return; /* found by bare name: the loader's search path had it */
    snprintf(buf, len, "%.*s", (int)(slash - info.dli_fname), info.dli_fname);
}

static void load(void)
{
    const char *env = getenv("ZERO_CUDA_MODULE");
    if (env && *env) { /* the override is the only place looked at */
        try_load(env);
        return;
    }
    char dir[4096], path[4200];
    own_dir(dir, sizeof dir);
    if (dir[0]) {
        snprintf(path, sizeof path, "%s/%s", dir, MODULE_FILE);
        if (try_load(path)) return;
    }
    if (strcmp(dir, ZERO_INSTALL_LIBDIR) != 0) {
        snprintf(path, sizeof path, "%s/%s", ZERO_INSTALL_LIBDIR, MODULE_FILE);
        if (try_load(path)) return;
    }
}

zero_status zero_cuda_load(const char *op)
{
    pthread_once(&load_once, load);
    if (zero_cu) return ZERO_OK;
    return zero_fail(NULL, ZERO_UNSUPPORTED,
                     "%s: CUDA is unavailable: the CUDA module %s could not be loaded (%s); set ZERO_CUDA_MODULE "
                     "to its path",
                     op, MODULE_FILE, load_error);
}

#endif /* ZERO_HAVE_CUDA */
