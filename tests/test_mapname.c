/* test_mapname.c: the names of mappings the SIGBUS report uses (common/mapname): an address inside
 * a named range gives its name, one outside or in a removed range none; a long name keeps its
 * kind and its end (the file's own name); a table full leaves later ones unnamed and takes names
 * again once slots are free; the output buffer's size is kept. */
#include "common/mapname.h"
#include "tests/test.h"

int main(void)
{
    static char area[4 * 4096];
    char buf[256];
    mapname_add(area, 4096, "ring", "/dflash-a");
    mapname_add(area + 4096, 8192, "dataset", "/data/train.bin");
    CHECK_INT(mapname_find(area + 17, buf, sizeof buf), ==, strlen("ring /dflash-a"));
    CHECK_STR(buf, "ring /dflash-a");
    CHECK(mapname_find(area + 4096 + 8191, buf, sizeof buf) > 0);
    CHECK_STR(buf, "dataset /data/train.bin");
    CHECK_INT(mapname_find(area + 3 * 4096, buf, sizeof buf), ==, 0);      /* past both */
    CHECK_STR(buf, "");
    CHECK_INT(mapname_find(area + 17, buf, 5), ==, 4);                     /* cut to the buffer */
    CHECK_STR(buf, "ring");
    mapname_remove(area);
    CHECK_INT(mapname_find(area + 17, buf, sizeof buf), ==, 0);

    /* a path longer than a slot's name: "file ..." and the end of the path */
    char longp[1200] = "/";
    for (int i = 0; i < 100; i++)
        strcat(longp, "deep/dir/");
    strcat(longp, "model-00007-of-00191.safetensors");
    mapname_add(area, 4096, "file", longp);
    CHECK(mapname_find(area, buf, sizeof buf) > 0);
    CHECK(strncmp(buf, "file ...", 8) == 0);
    CHECK(strlen(buf) < 200);
    const char *end = "dir/model-00007-of-00191.safetensors";
    CHECK_STR(buf + strlen(buf) - strlen(end), end);
    mapname_remove(area);

    /* the table full (the dataset's name still in it): the next one unnamed, named again once a
     * slot is free */
    static char many[MAPNAME_MAX + 1];
    for (int i = 0; i < MAPNAME_MAX - 1; i++)
        mapname_add(many + i, 1, "shard", "s");
    mapname_add(many + MAPNAME_MAX - 1, 1, "one", "too many");
    CHECK_INT(mapname_find(many + MAPNAME_MAX - 1, buf, sizeof buf), ==, 0);
    CHECK(mapname_find(many + 5, buf, sizeof buf) > 0);
    CHECK_STR(buf, "shard s");
    mapname_remove(many + 5);
    mapname_add(many + MAPNAME_MAX - 1, 1, "one", "too many");
    CHECK(mapname_find(many + MAPNAME_MAX - 1, buf, sizeof buf) > 0);
    CHECK_STR(buf, "one too many");
    CHECK(mapname_find(area + 4096, buf, sizeof buf) > 0);
    CHECK_STR(buf, "dataset /data/train.bin");
    printf("ok\n");
    return 0;
}
