/* test_cuda_notready.c: polling an event or stream that has not finished (cudaErrorNotReady) leaves
 * no error behind. The target's pipeline polls its events between launches and then judges each
 * launch by cudaGetLastError(): were NotReady recorded as the last error, a healthy launch after a
 * poll would be taken for a failed one. The stream is held busy by a host function that waits for
 * this thread, so the event is not ready for certain while it is polled. */
#include "tests/test_gpukern.h"
#ifdef DFLASH_HAVE_CUDA
#include <stdatomic.h>

static atomic_int release_flag;

static void CUDART_CB hold_stream(void *arg)
{
    (void)arg;
    while (!atomic_load(&release_flag))
        usleep(1000);
}

int main(void)
{
    gk_test_require_gpu();
    cudaStream_t s;
    cudaEvent_t ev;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CUDA_CHECK(cudaLaunchHostFunc(s, hold_stream, NULL));
    CUDA_CHECK(cudaEventRecord(ev, s));
    for (int i = 0; i < 100; i++) {
        CHECK_INT(cudaEventQuery(ev), ==, cudaErrorNotReady);
        CHECK_INT(cudaStreamQuery(s), ==, cudaErrorNotReady);
        CHECK_INT(cudaPeekAtLastError(), ==, cudaSuccess);
        CHECK_INT(cudaGetLastError(), ==, cudaSuccess);
    }
    atomic_store(&release_flag, 1);
    CUDA_CHECK(cudaEventSynchronize(ev));
    CHECK_INT(cudaEventQuery(ev), ==, cudaSuccess);
    CHECK_INT(cudaGetLastError(), ==, cudaSuccess);
    CUDA_CHECK(cudaEventDestroy(ev));
    CUDA_CHECK(cudaStreamDestroy(s));
    return 0;
}
#else
int main(void) { SKIP("built without CUDA"); }
#endif
