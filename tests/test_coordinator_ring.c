/* test_coordinator_ring.c: the ring layout the coordinator derives from model.path agrees with
 * what target-d computes (DFlash default capture ids), and capture ids that cannot exist are a
 * configuration error (exit 78, the key named), never a ring the daemons would refuse. */
#include <sys/stat.h>
#include "model/target.h"
#include "tests/test_coord_util.h"

static void cleanup(void)
{
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

static void write_model(const char *dir, int layers)
{
    char p[600];
    mkdir(dir, 0700);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    CHECK(f);
    fprintf(f, "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":32,\"num_hidden_layers\":%d,"
               "\"num_attention_heads\":4,\"num_key_value_heads\":1,\"head_dim\":16,\"intermediate_size\":64,"
               "\"vocab_size\":500}\n", layers);
    fclose(f);
}

/* The cluster config of tc_setup, but sized from a model dir instead of ring_hidden. */
static void write_ini(const char *model, const char *model_keys)
{
    FILE *f = fopen(TC.ini, "w");
    CHECK(f);
    fprintf(f, "[cluster]\nname = %s\nruntime_dir = %s\nstate_dir = %s\n"
               "[ring]\nslots = 4\nmax_tokens = 512\nmax_seqs = 64\n"
               "[model]\npath = %s\n%s\n"
               "[coordinator]\nheartbeat_ms = 50\n"
               "[data]\npath = %s\ntoken_budget = 512\nmax_seq_len = 256\nbucket_width = 32\n",
            TC.name, TC.dir, TC.dir, model, model_keys, TC.data);
    fclose(f);
}

/* Start the coordinator on a bad config: it must exit 78 within 10 s naming `needle`. */
static void expect_config_error(const char *needle)
{
    char log[400], cmd[1000];
    snprintf(log, sizeof log, "%s/coordinator.log", TC.dir);
    unlink(log);
    char *argv[] = { (char *)tc_bin("bin/coordinator-d"), "-c", TC.ini, NULL };
    TC.coord = tc_spawn(argv, log);
    int st = 0;
    pid_t w = 0;
    for (uint64_t end = mono_ms() + 10000; !w && mono_ms() < end;) {
        w = waitpid(TC.coord, &st, WNOHANG);
        if (!w)
            tc_sleep_ms(20);
    }
    if (!w) {
        snprintf(cmd, sizeof cmd, "tail -5 '%s' >&2", log);
        if (system(cmd)) {}
        TEST_FAIL("coordinator came up on a config it should refuse (%s)", needle);
    }
    TC.coord = 0;
    CHECK(WIFEXITED(st));
    CHECK_INT(WEXITSTATUS(st), ==, 78);
    snprintf(cmd, sizeof cmd, "grep -q -- '%s' '%s'", needle, log);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    atexit(cleanup);
    tc_setup(NULL, NULL);
    tc_dataset(TC.data, 50, 8, 100, 500);
    char model[600];
    snprintf(model, sizeof model, "%s/model", TC.dir);

    /* 2 target layers have no DFlash default for 3 drafter layers (target-d refuses it too) */
    write_model(model, 2);
    write_ini(model, "draft_layers = 3");
    expect_config_error("model.draft_layers");
    /* an explicit id past the model's last layer */
    write_model(model, 4);
    write_ini(model, "capture_layers = 1,4");
    expect_config_error("model.capture_layers: layer id 4 is out of range");
    write_ini(model, "capture_layers = -1");
    expect_config_error("model.capture_layers");
    /* a model dir without config.json: a config error too, not a restart loop */
    char missing[700];
    snprintf(missing, sizeof missing, "%s/absent", TC.dir);
    write_ini(missing, "");
    expect_config_error("model.path");

    /* Another program's object under the ring's name is left alone: exit 78, its bytes kept. */
    write_model(model, 8);
    write_ini(model, "draft_layers = 2");
    int fd = shm_open(TC.ring, O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0);
    static const char theirs[] = "someone else's shared memory, not a ring";
    CHECK_INT(write(fd, theirs, sizeof theirs), ==, (ssize_t)sizeof theirs);
    expect_config_error("not a dflash ring (bad magic .*left alone; remove /dev/shm/dflash-.* or give cluster.name");
    char back[sizeof theirs] = "";
    CHECK_INT(pread(fd, back, sizeof back, 0), ==, (ssize_t)sizeof theirs);
    CHECK(memcmp(back, theirs, sizeof theirs) == 0);
    /* ... also when it is not to be trusted (every user may write it): it is still not dflash's */
    CHECK_OK(fchmod(fd, 0666));
    expect_config_error("writable by every user.*, and is not a dflash ring: left alone");
    CHECK_INT(pread(fd, back, sizeof back, 0), ==, (ssize_t)sizeof theirs);
    CHECK(memcmp(back, theirs, sizeof theirs) == 0);
    close(fd);
    ring_unlink(TC.ring);
    /* A folder or a symbolic link under the name: nothing to replace, named as what it is (a folder
     * was taken for a FIFO and replaced in vain, exit 1; a link gave ELOOP, exit 1) */
    char shm[300];
    snprintf(shm, sizeof shm, "/dev/shm%s", TC.ring);
    CHECK_OK(mkdir(shm, 0700));
    expect_config_error("/dev/shm/dflash-.* is a folder, not a ring: left alone; remove /dev/shm/dflash-");
    CHECK_OK(rmdir(shm));
    CHECK_OK(symlink("/dev/null", shm));
    expect_config_error("/dev/shm/dflash-.* is a symbolic link, not a ring: left alone");
    CHECK_OK(unlink(shm));

    /* A ring whose creator died before finishing it (no magic yet) is dflash's own: replaced. */
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        struct ring *half = NULL;
        struct ring_layout hl = { .nslots = 2, .hidden = 32, .n_layers = 1, .layer_ids = { 1 },
                                  .dtype = RING_DTYPE_BF16, .max_tokens = 16, .max_seqs = 4 };
        char e[256];
        if (ring_create(&half, TC.ring, &hl, NULL, e, sizeof e) < 0)
            _exit(1);
        atomic_store((_Atomic uint64_t *)ring_base(half), 0);     /* the magic, first in the header */
        _exit(0);
    }
    int cst = 0;
    CHECK_INT(waitpid(child, &cst, 0), ==, child);
    CHECK(WIFEXITED(cst) && WEXITSTATUS(cst) == 0);

    /* the default: the same ids target_default_layer_ids gives target-d */
    tc_start_coord();
    char cmd[900];
    snprintf(cmd, sizeof cmd, "grep -q 'replacing ring %s: left half-made by pid %d, which died' '%s/coordinator.log'",
             TC.ring, (int)child, TC.dir);
    CHECK(system(cmd) == 0);
    struct ring *r = NULL;
    char err[512];
    CHECK_OK(ring_attach(&r, TC.ring, NULL, RING_ATTACH_ANY | RING_ATTACH_RDONLY, err, sizeof err));
    int ids[8];
    CHECK_INT(target_default_layer_ids(8, 2, ids), ==, 2);
    const struct ring_layout *l = ring_layout(r);
    CHECK_INT(l->hidden, ==, 32);
    CHECK_INT(l->n_layers, ==, 2);
    CHECK_INT(l->layer_ids[0], ==, ids[0]);
    CHECK_INT(l->layer_ids[1], ==, ids[1]);
    ring_detach(r);
    printf("ring layout from the model: ids %d,%d\n", ids[0], ids[1]);

    /* A ring of an older layout version (left by the build before an upgrade, its coordinator
     * gone) is dflash's own: replaced by one of this version at the next start. */
    tc_kill(TC.coord);
    TC.coord = 0;
    uint32_t old = RING_VERSION - 1;
    fd = shm_open(TC.ring, O_RDWR, 0);
    CHECK(fd >= 0);
    CHECK_INT(pwrite(fd, &old, 4, 8), ==, 4);          /* the version, after the 8-byte magic */
    close(fd);
    CHECK_INT(ring_attach(&r, TC.ring, NULL, RING_ATTACH_ANY | RING_ATTACH_RDONLY, err, sizeof err), ==, -DF_EVERSION);
    tc_start_coord();
    snprintf(cmd, sizeof cmd, "grep -q 'replacing incompatible ring %s: ring %s: layout version %u, this build speaks "
             "version %u' '%s/coordinator.log'", TC.ring, TC.ring, old, (unsigned)RING_VERSION, TC.dir);
    CHECK(system(cmd) == 0);
    CHECK_OK(ring_attach(&r, TC.ring, NULL, RING_ATTACH_ANY | RING_ATTACH_RDONLY, err, sizeof err));
    ring_detach(r);
    printf("a ring of layout version %u replaced by version %u\n", old, (unsigned)RING_VERSION);
    return 0;
}
