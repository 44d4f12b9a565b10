/* fuzz_safetensors.c: fuzz target for the safetensors reader (model/safetensors.c st_open_file):
 * an accepted file's tensors must be sorted, findable, consistent in size and readable in full. */
#include "tests/fuzz/fuzz_st.h"

int fuzz_safetensors(const uint8_t *data, size_t size)
{
    static int fd = -1;
    char path[64], err[512];
    struct st_set *s = NULL;
    const char *p = fuzz_memfile(&fd, path, sizeof path, data, size);
    if (!p)
        return 0;
    err[0] = 0;
    if (st_open_file(&s, p, err, sizeof err) == 0) {
        FUZZ_ASSERT(s && !strcmp(st_source(s), p));
        st_walk(s);
        st_close(s);
    } else {
        FUZZ_ASSERT(s == NULL);
        FUZZ_ASSERT(fuzz_err_ok(err, sizeof err));
    }
    return 0;
}
