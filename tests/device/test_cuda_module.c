/* CUDA as a module libzero loads on first use (device/cuda_module.h), seen
 * from a consumer. Run by test_cuda_module.sh, which sets the scene:
 *
 *   cpu      a CPU-only consumer (device memory, copies, a fill, a local
 *            all-reduce) works, and when it is done no CUDA library and no
 *            libzero-cuda is mapped into the process;
 *   cuda     (CUDA build) opening a CUDA device loads the module: without a
 *            GPU it is ZERO_UNSUPPORTED "no usable CUDA device" (with one, it
 *            opens); a NCCL comm without a GPU is ZERO_UNSUPPORTED too;
 *   missing  (CUDA build, ZERO_CUDA_MODULE=<a file that does not exist>)
 *            zero_cuda_available() is 0, and opening a CUDA device or a NCCL
 *            comm is ZERO_UNSUPPORTED with a message naming that file;
 *   nolibs   (CUDA build, CUDA's libraries off the loader's path) the same,
 *            the message naming the CUDA library the module could not load.
 *
 *   test_cuda_module cpu | cuda | missing | nolibs  (the last three: 77 in a CPU-only build) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zero/zero.h>

#include "check.h"
#include "zero_build_config.h"

/* The first line of /proc/self/maps that names `needle`, or NULL. */
static char *mapped(const char *needle)
{
    static char line[4096];
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return NULL;
    char *hit = NULL;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle)) {
            hit = line;
            break;
        }
    fclose(f);
    return hit;
}

static void check_nothing_cuda_mapped(void)
{
    static const char *libs[] = {"libcudart", "libcublas", "libnccl", "libcuda.so", "libzero-cuda"};
    for (size_t i = 0; i < sizeof libs / sizeof *libs; i++) {
        char *line = mapped(libs[i]);
        CHECK_MSG(!line, "a CPU-only run mapped %s: %s", libs[i], line);
    }
}

static void test_cpu_consumer(void)
{
    zero_device *dev = NULL;
    CHECK_OK(zero_device_create(&dev, ZERO_DEVICE_CPU, 0));
    if (!dev) return;
    enum { N = 1000 };
    float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)i * 0.5f;
    void *d = NULL;
    CHECK_OK(zero_device_alloc(dev, sizeof host, &d));
    CHECK_OK(zero_memcpy(dev, d, host, sizeof host));
    zero_comm_config cc = ZERO_COMM_CONFIG_INIT;
    cc.backend = ZERO_BACKEND_LOCAL;
    zero_comm *comm = NULL;
    CHECK_OK(zero_comm_create_world(&comm, &cc));
    if (comm) CHECK_OK(zero_allreduce(comm, d, d, N, ZERO_F32, ZERO_SUM));
    CHECK_OK(zero_memcpy(dev, back, d, sizeof back));
    CHECK(memcmp(host, back, sizeof host) == 0); /* one rank: the sum is the input, bitwise */
    zero_comm_destroy(comm);
    zero_device_free(dev, d);
    zero_device_destroy(dev);
    check_nothing_cuda_mapped();
}

#if ZERO_HAVE_CUDA
static int contains(const char *s, const char *needle) { return s && strstr(s, needle) != NULL; }

/* A CUDA device and (with NCCL) a NCCL comm are refused with `want` (the
 * comm: `comm_want`) in the message; with a GPU and the module, the device
 * opens instead. */
static void test_cuda_refused(const char *want, const char *comm_want, int gpu_ok)
{
    zero_device *dev = NULL;
    zero_status st = zero_device_create(&dev, ZERO_DEVICE_CUDA, 0);
    if (gpu_ok && zero_cuda_available()) {
        CHECK_MSG(st == ZERO_OK, "a GPU is visible, yet zero_device_create: %s", zero_last_error());
        zero_device_destroy(dev);
        return;
    }
    CHECK_MSG(st == ZERO_UNSUPPORTED && !dev, "zero_device_create(CUDA) returned %s, want ZERO_UNSUPPORTED (%s)",
              zero_status_name(st), zero_last_error());
    CHECK_MSG(contains(zero_last_error(), want), "zero_device_create(CUDA): \"%s\" lacks \"%s\"", zero_last_error(),
              want);
    CHECK_MSG(contains(zero_last_error(), "zero_device_create"), "\"%s\" does not name the call", zero_last_error());
#if ZERO_HAVE_NCCL
    zero_comm_config cc = ZERO_COMM_CONFIG_INIT;
    cc.backend = ZERO_BACKEND_NCCL;
    zero_comm *comm = NULL;
    st = zero_comm_create_world(&comm, &cc);
    CHECK_MSG(st == ZERO_UNSUPPORTED && !comm, "zero_comm_create_world(NCCL) returned %s, want ZERO_UNSUPPORTED (%s)",
              zero_status_name(st), zero_last_error());
    CHECK_MSG(contains(zero_last_error(), comm_want), "zero_comm_create_world(NCCL): \"%s\" lacks \"%s\"",
              zero_last_error(), comm_want);
    zero_comm_destroy(comm);
#else
    (void)comm_want; /* a build without NCCL has no NCCL comm to refuse */
#endif
}
#endif

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    if (strcmp(mode, "cpu") == 0) {
        test_cpu_consumer();
        return check_exit();
    }
#if ZERO_HAVE_CUDA
    if (strcmp(mode, "cuda") == 0) {
        test_cuda_refused("no usable CUDA device", "no CUDA device", 1);
        /* The module was loaded to find that out. */
        CHECK_MSG(mapped("libzero-cuda") != NULL, "opening a CUDA device did not load libzero-cuda");
    } else if (strcmp(mode, "missing") == 0) {
        const char *path = getenv("ZERO_CUDA_MODULE");
        CHECK_MSG(path && *path, "set ZERO_CUDA_MODULE to a file that does not exist");
        CHECK(zero_cuda_available() == 0);
        if (path) test_cuda_refused(path, path, 0);
    } else if (strcmp(mode, "nolibs") == 0) {
        CHECK(zero_cuda_available() == 0);
        test_cuda_refused("libcudart", "libcudart", 0);
        CHECK_MSG(mapped("libcudart") == NULL, "libcudart is mapped: %s", mapped("libcudart"));
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 1;
    }
    return check_exit();
#else
    printf("%s: libzero built without CUDA\n", mode);
    return 77;
#endif
}
