/* test_config.c: the INI loader: defaults, overrides, every error names file:line: key.
 * Also checks etc/dflash.ini documents every key with its default. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/config.h"
#include "tests/test.h"

static const char *write_tmp(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", name);
    FILE *f = fopen(path, "w");
    CHECK(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* Like write_tmp, for text that holds NUL bytes. */
static const char *write_tmp_bytes(const char *name, const char *data, size_t len)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", name);
    FILE *f = fopen(path, "w");
    CHECK(f);
    CHECK(fwrite(data, 1, len, f) == len);
    fclose(f);
    return path;
}

static void expect_path_error(const char *path, const char *needle)
{
    struct dflash_cfg cfg;
    char err[512] = "";
    CHECK(cfg_load(&cfg, path, err, sizeof err) < 0);
    CHECK_CONTAINS(err, path);
    CHECK_CONTAINS(err, needle);
    CHECK(!strchr(err, '\n'));
}

static void expect_error(const char *text, const char *needle)
{
    struct dflash_cfg cfg;
    char err[512] = "";
    const char *p = write_tmp("bad.ini", text);
    CHECK(cfg_load(&cfg, p, err, sizeof err) < 0);
    CHECK_CONTAINS(err, p);
    CHECK_CONTAINS(err, needle);
}

int main(void)
{
    struct dflash_cfg cfg;
    char err[512] = "";

    CHECK_OK(cfg_load(&cfg, NULL, err, sizeof err));

    /* One section alone: mistakes elsewhere (a bad value, an unknown section, a syntax error) are
     * passed over, the section's own are errors; the other sections keep their defaults. */
    const char *part = write_tmp("part.ini", "[ring]\nslots = many\n[nope]\nx = 1\nnot a line\n"
                                             "[cluster]\nname = partial\n[drafter]\nlr = 1e-3\n");
    CHECK(cfg_load(&cfg, part, err, sizeof err) < 0);
    CHECK_OK(cfg_load_section(&cfg, part, "cluster", NULL, err, sizeof err));
    CHECK_STR(cfg.cluster.name, "partial");
    CHECK_INT(cfg.ring.slots, ==, 16);
    CHECK(cfg.drafter.lr != 1e-3);
    part = write_tmp("part2.ini", "[ring]\nslots = many\n[cluster]\nname = a b\n");
    CHECK(cfg_load_section(&cfg, part, "cluster", NULL, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "part2.ini:4: cluster.name");
    CHECK_INT(cfg.ring.slots, ==, 16);
    CHECK_STR(cfg.drafter.pick, "oldest");
    CHECK_NEAR(cfg.drafter.gamma, 7.0, 0);
    /* A line too long to read elsewhere is passed over whole (the section after it still read);
     * in the section, or a header that may be its own, it fails the read. So does a syntax
     * error in the section, even after one elsewhere; a BOM before its header is no error. */
    static char ltext[3 * 8192];
    char longval[6000];
    memset(longval, '1', sizeof longval - 1);
    longval[sizeof longval - 1] = 0;
    snprintf(ltext, sizeof ltext, "[model]\ncapture_layers = %s\n[cluster]\nname = after_long\n", longval);
    CHECK_OK(cfg_load_section(&cfg, write_tmp("long1.ini", ltext), "cluster", NULL, err, sizeof err));
    CHECK_STR(cfg.cluster.name, "after_long");
    snprintf(ltext, sizeof ltext, "[cluster]\nname = x\nsocket = /%s\n", longval);
    CHECK(cfg_load_section(&cfg, write_tmp("long2.ini", ltext), "cluster", NULL, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "long2.ini:3: line longer than 4094 bytes");
    snprintf(ltext, sizeof ltext, "[model]\n[%s]\nname = x\n", longval);
    CHECK(cfg_load_section(&cfg, write_tmp("long3.ini", ltext), "cluster", NULL, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "long3.ini:2: line longer than 4094 bytes");
    part = write_tmp("syn.ini", "[model]\nbogus line\n[cluster]\nname foo\nname = bar\n");
    CHECK(cfg_load_section(&cfg, part, "cluster", NULL, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "syn.ini:4: syntax error: no '=' or ':' in it");
    part = write_tmp("syn2.ini", "[cluster]\nname = x ; a comment = here\nruntime_dir ; = /x\n");
    CHECK(cfg_load_section(&cfg, part, "cluster", NULL, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "syn2.ini:3: syntax error");
    part = write_tmp("syn3.ini", "[model]\n[cluster\nname = x\n");
    CHECK(cfg_load_section(&cfg, part, "cluster", NULL, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "syn3.ini:2: a '[' line without ']'");
    CHECK_OK(cfg_load_section(&cfg, write_tmp("bom.ini", "\xef\xbb\xbf[cluster]\nname = bom\n[ring]\nx\n"),
                              "cluster", NULL, err, sizeof err));
    CHECK_STR(cfg.cluster.name, "bom");
    /* whether the section is there at all (a misspelt header: the defaults are another cluster's) */
    bool present = true;
    CHECK_OK(cfg_load_section(&cfg, write_tmp("nosec.ini", "[clustr]\nname = x\n[ring]\nslots = 4\n"), "cluster",
                              &present, err, sizeof err));
    CHECK(!present);
    CHECK_OK(cfg_load_section(&cfg, write_tmp("sec.ini", "[ring]\nslots = 4\n[cluster]\n"), "cluster", &present, err,
                              sizeof err));
    CHECK(present);

    const char *p = write_tmp("ok.ini", "[ring]\nslots = 8\n[drafter]\ngamma = 3.5\npick = random\n");
    CHECK_OK(cfg_load(&cfg, p, err, sizeof err));
    CHECK_INT(cfg.ring.slots, ==, 8);
    CHECK_NEAR(cfg.drafter.gamma, 3.5, 0);
    CHECK_STR(cfg.drafter.pick, "random");
    CHECK_OK(cfg_set(&cfg, "ring.slots=32", err, sizeof err));
    {   /* an override too long to be one: the key and the limit named */
        static char o[700] = "model.path=/";
        memset(o + 12, 'm', sizeof o - 13);
        CHECK(cfg_set(&cfg, o, err, sizeof err) < 0);
        CHECK_STR(err, "override model.path: longer than 511 bytes");
    }
    CHECK_INT(cfg.ring.slots, ==, 32);
    CHECK(cfg_set(&cfg, "ring.nope=1", err, sizeof err) < 0);
    CHECK_CONTAINS(err, "unknown key");
    CHECK(cfg_set(&cfg, "nope.x=1", err, sizeof err) < 0);
    CHECK_STR(err, "override nope.x: unknown section");
    CHECK_OK(cfg_set(&cfg, "ring.slots = 12 ", err, sizeof err));     /* blanks as in the file */
    CHECK_INT(cfg.ring.slots, ==, 12);
    CHECK_OK(cfg_set(&cfg, " ring . slots=13", err, sizeof err));
    CHECK_INT(cfg.ring.slots, ==, 13);
    CHECK(cfg_set(&cfg, "cluster.runtime_dir=\"/run/x\"", err, sizeof err) < 0);
    CHECK_STR(err, "override cluster.runtime_dir: \"/run/x\": in quotes: write the value without them (they would be part of it)");

    expect_error("[ring]\nslots = 8\nbogus = 1\n", ":3: ring.bogus: unknown key");
    expect_error("[nosuch]\nx = 1\n", ":1: [nosuch]: unknown section");
    /* a misspelt header over keys commented out: nothing would say the section is never read */
    expect_error("[ring]\nslots = 8\n[coordintor]\n# heartbeat_ms = 50\n", ":3: [coordintor]: unknown section");
    expect_error("[ ring ]\nslots = 8\n", ":1: [ ring ]: unknown section");
    expect_error("slots = 3\n[ring]\n", ":1: slots: a key outside any [section]");
    expect_error("[ring]\n\nslots = eight\n", ":3: ring.slots: not an integer");
    expect_error("[ring]\nslots = 1\n", ":2: ring.slots: 1 out of range");
    expect_error("[ring]\nslots = 99999999999999999999\n", ":2: ring.slots: 99999999999999999999 out of range [");
    expect_error("[cluster]\nruntime_dir = \"/run/x\"\n", ":2: cluster.runtime_dir: \"/run/x\": in quotes: write the value");
    expect_error("[model]\npath = '/m'\n", ":2: model.path: '/m': in quotes");
    expect_error("[drafter]\ngamma = -2\n", "drafter.gamma: -2 out of range");
    expect_error("[drafter]\nbeta2 = 1\n", "drafter.beta2: 1 out of range");     /* bias correction 1 - 1^t = 0 */
    expect_error("[drafter]\nadam_eps = 0\n", "drafter.adam_eps: 0 out of range");
    expect_error("[drafter]\ngamma = nan\n", "drafter.gamma: not a number");
    /* Ranges of doubles shown as the table has them (not rounded to 1); an underflow is a number
     * that the range judges (not "not a number"), shown as written. */
    expect_error("[drafter]\nbeta1 = 1\n", "drafter.beta1: 1 out of range [0, 0.9999999]");
    expect_error("[drafter]\nbeta2 = 0.99999995\n", "drafter.beta2: 0.99999995 out of range [0, 0.9999999]");
    expect_error("[drafter]\nadam_eps = 1e-31\n", "drafter.adam_eps: 1e-31 out of range [1e-30, 1]");
    expect_error("[drafter]\nadam_eps = 1e-400\n", "drafter.adam_eps: 1e-400 out of range [1e-30, 1]");
    expect_error("[drafter]\nlr = 1e999\n", "drafter.lr: 1e999 out of range [0, 10]");
    p = write_tmp("tiny.ini", "[drafter]\nlr = 1e-310\n");
    CHECK_OK(cfg_load(&cfg, p, err, sizeof err));
    CHECK(cfg.drafter.lr > 0 && cfg.drafter.lr < 1e-300);
    /* Enumerated values are the loader's: every program reading the file refuses them. */
    expect_error("[target]\nbackend = tpu\n", ":2: target.backend: 'tpu': expected cpu or cuda");
    expect_error("[drafter]\npick = newest\n", ":2: drafter.pick: 'newest': expected oldest or random");
    expect_error("[cluster]\nlog_level = loud\n", ":2: cluster.log_level: 'loud': expected error, warn, notice, info or debug");
    expect_error("[ring\nslots=3\n", ":1: syntax error");
    /* Text after a section's ']' is refused (inih would drop it: ring.slots left at 16 unsaid);
     * blanks and a comment there are fine, a BOM before the first line too. */
    expect_error("[ring] slots = 4\n", ":1: [ring]: 'slots = 4' after the section name (a key goes on a line of its own)");
    expect_error("[data]\nseed = 1\n  [ring]]\r\n", ":3: [ring]: ']' after the section name");
    p = write_tmp("secfine.ini", "\xef\xbb\xbf[ring]  ; the ring\n[data]\t# the data\r\nseed = 3\n");
    CHECK_OK(cfg_load(&cfg, p, err, sizeof err));
    CHECK_INT(cfg.data.seed, ==, 3);
    expect_error("[ring]\nslots = 8\nbogus = 1\nalso = 2\n", ":3: ring.bogus: unknown key");     /* the first */

    /* A line too long for the reader is refused, never split: the tail of this comment would
     * otherwise come alive as "seed = 99". */
    static char x[5001], longline[6000];
    memset(x, 'x', 5000);
    snprintf(longline, sizeof longline, "[data]\n# %s seed = 99\n", x);
    expect_error(longline, ":2: line longer than 4094 bytes");
    /* One that fits, as long as the longest string key allows. */
    char dir[300], text2[400];
    memset(dir, 'd', 250);
    dir[0] = '/';
    dir[250] = 0;
    snprintf(text2, sizeof text2, "[cluster]\nstate_dir = %s\n", dir);
    p = write_tmp("long.ini", text2);
    CHECK_OK(cfg_load(&cfg, p, err, sizeof err));
    CHECK_STR(cfg.cluster.state_dir, dir);
    /* Indented keys are keys (no continuation lines), integers are decimal. */
    p = write_tmp("indent.ini", "[data]\n    epochs = 010\n    seed = 7\n");
    CHECK_OK(cfg_load(&cfg, p, err, sizeof err));
    CHECK_INT(cfg.data.epochs, ==, 10);
    CHECK_INT(cfg.data.seed, ==, 7);

    /* Relative paths: from the file's folder (a file named by a relative path too), from the
     * current folder for -o; absolute ones and names that are not paths stay as written. */
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char sub[512], want[PATH_MAX + 64], cwd[512];
    snprintf(sub, sizeof sub, "%s/cfgrel", tmp);
    mkdir(sub, 0755);
    p = write_tmp("cfgrel/rel.ini", "[data]\npath = data.bin\n[model]\npath = ../models/m\n"
                  "[cluster]\nstate_dir = /srv/s\nname = x.y\n");
    CHECK_OK(cfg_load(&cfg, p, err, sizeof err));
    snprintf(want, sizeof want, "%s/data.bin", sub);
    CHECK_STR(cfg.data.path, want);
    snprintf(want, sizeof want, "%s/models/m", tmp);     /* (kept paths have no dot part) */
    CHECK_STR(cfg.model.path, want);
    CHECK_STR(cfg.cluster.state_dir, "/srv/s");
    CHECK_STR(cfg.cluster.name, "x.y");
    CHECK_STR(cfg.drafter.checkpoint_dir, "");      /* empty stays empty (= under state_dir) */
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK_OK(chdir(tmp));
    CHECK_OK(cfg_load(&cfg, "cfgrel/rel.ini", err, sizeof err));
    CHECK(cfg.data.path[0] == '/');
    CHECK_CONTAINS(cfg.data.path, "/cfgrel/data.bin");
    /* The same file named through another folder ("../" of it): the same paths, none naming
     * that folder (a daemon started there must not keep a path that breaks when it goes) */
    char real_sub[PATH_MAX], first[sizeof cfg.data.path];
    CHECK(realpath(sub, real_sub) != NULL);
    snprintf(want, sizeof want, "%s/data.bin", real_sub);
    CHECK_STR(cfg.data.path, want);
    snprintf(first, sizeof first, "%s", cfg.model.path);
    mkdir("cfgrel/away", 0755);
    CHECK_OK(chdir("cfgrel/away"));
    CHECK_OK(cfg_load(&cfg, "./../rel.ini", err, sizeof err));
    CHECK_STR(cfg.data.path, want);
    CHECK_STR(cfg.model.path, first);
    CHECK_OK(cfg_set(&cfg, "drafter.checkpoint_dir=./../../ck/./x", err, sizeof err));
    CHECK(strstr(cfg.drafter.checkpoint_dir, "/./") == NULL && strstr(cfg.drafter.checkpoint_dir, "/../") == NULL);
    CHECK_CONTAINS(cfg.drafter.checkpoint_dir, "/ck/x");
    CHECK_OK(cfg_set(&cfg, "drafter.checkpoint_dir=..", err, sizeof err));
    CHECK_STR(cfg.drafter.checkpoint_dir, real_sub);
    CHECK_OK(chdir(tmp));
    rmdir("cfgrel/away");
    /* "../" from a folder named through a symbolic link goes up from where the link leads (as the
     * kernel takes it); a "//" before the file name leaves no "//" in the paths; a folder whose
     * name ends in '.' is only a name (its read once took for ever) */
    mkdir("cfgrel/real", 0755);
    mkdir("cfgrel/real/deep", 0755);
    unlink("cfgrel/link");
    CHECK_OK(symlink("real/deep", "cfgrel/link"));
    char lpath[PATH_MAX + 64];
    snprintf(lpath, sizeof lpath, "%s/cfgrel/link//rel.ini", tmp);
    FILE *lf = fopen("cfgrel/link/rel.ini", "w");
    CHECK(lf && fputs("[data]\npath = ../up.bin\n[model]\npath = m\n", lf) >= 0);
    fclose(lf);
    CHECK_OK(cfg_load(&cfg, lpath, err, sizeof err));
    snprintf(want, sizeof want, "%s/real/up.bin", real_sub);
    CHECK_STR(cfg.data.path, want);
    snprintf(want, sizeof want, "%s/cfgrel/link/m", tmp);      /* (no "../": kept as named) */
    CHECK_STR(cfg.model.path, want);
    /* named relative to "/" (a daemon started in /): no "//" */
    CHECK_OK(chdir("/"));
    snprintf(lpath, sizeof lpath, "%s/cfgrel/rel.ini", tmp + 1);
    CHECK_OK(cfg_load(&cfg, lpath, err, sizeof err));
    CHECK(strncmp(cfg.data.path, "//", 2) != 0);
    CHECK_CONTAINS(cfg.data.path, "/cfgrel/data.bin");
    CHECK_OK(chdir(tmp));
    mkdir("cfgrel/run.", 0755);
    lf = fopen("cfgrel/run./rel.ini", "w");
    CHECK(lf && fputs("[data]\npath = d.bin\n", lf) >= 0);
    fclose(lf);
    snprintf(lpath, sizeof lpath, "%s/cfgrel/run./rel.ini", tmp);
    CHECK_OK(cfg_load(&cfg, lpath, err, sizeof err));
    snprintf(want, sizeof want, "%s/cfgrel/run./d.bin", tmp);
    CHECK_STR(cfg.data.path, want);
    unlink("cfgrel/run./rel.ini");
    rmdir("cfgrel/run.");
    unlink("cfgrel/link/rel.ini");
    unlink("cfgrel/link");
    rmdir("cfgrel/real/deep");
    rmdir("cfgrel/real");
    CHECK_OK(cfg_set(&cfg, "drafter.metrics_path=m.jsonl", err, sizeof err));
    char here[512];
    CHECK(getcwd(here, sizeof here) != NULL);
    snprintf(want, sizeof want, "%s/m.jsonl", here);
    CHECK_STR(cfg.drafter.metrics_path, want);
    /* In a folder whose path is longer than a value may be, an absolute value is taken as it is:
     * only a relative one needs the current folder (it failed: "the current folder: ERANGE"). */
    char deep[64];
    memset(deep, 'd', 60);
    deep[60] = 0;
    for (int i = 0; i < 5; i++)
        CHECK_OK((mkdir(deep, 0755) < 0 && errno != EEXIST) ? -errno : chdir(deep));
    CHECK_OK(cfg_set(&cfg, "data.path=/abs/x.bin", err, sizeof err));
    CHECK_STR(cfg.data.path, "/abs/x.bin");
    CHECK(cfg_set(&cfg, "data.path=x.bin", err, sizeof err) < 0);
    CHECK_CONTAINS(err, "override data.path: the current folder: ");
    CHECK_OK(chdir(cwd));
    char lng[300], asg[400];
    memset(lng, 'r', 250);
    lng[250] = 0;
    snprintf(asg, sizeof asg, "data.path=%s", lng);
    CHECK(cfg_set(&cfg, asg, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "override data.path: 'rrr");
    CHECK_CONTAINS(err, "is longer than 255 bytes");

    CHECK(cfg_load(&cfg, "/nonexistent/x.ini", err, sizeof err) < 0);
    CHECK_CONTAINS(err, "/nonexistent/x.ini: cannot open");

    int ids[8];
    CHECK_INT(cfg_parse_int_list("1, 9,17,25,33", ids, 8), ==, 5);
    CHECK_INT(ids[4], ==, 33);
    CHECK(cfg_parse_int_list("1,x", ids, 8) < 0);
    CHECK(cfg_parse_int_list("1,1", ids, 8) < 0);
    CHECK(cfg_parse_int_list("1,,2", ids, 8) < 0);
    CHECK(cfg_parse_int_list(",1", ids, 8) < 0);
    CHECK(cfg_parse_int_list("1,2,", ids, 8) < 0);
    CHECK_INT(cfg_parse_int_list("0,1,2,3,4,5,6,7,8", ids, 8), ==, -E2BIG);

    /* Only a regular file is a config file: a directory read as an empty file (all defaults),
     * a FIFO or /dev/zero never ended. */
    const char *tmpdir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char special[512];
    snprintf(special, sizeof special, "%s/cfgdir", tmpdir);
    CHECK(mkdir(special, 0700) == 0 || errno == EEXIST);
    expect_path_error(special, ": not a regular file");
    snprintf(special, sizeof special, "%s/cfgfifo", tmpdir);
    unlink(special);
    CHECK(mkfifo(special, 0600) == 0);
    expect_path_error(special, ": not a regular file");      /* without a writer: no hang */
    unlink(special);
    expect_path_error("/dev/zero", "/dev/zero: not a regular file");

    /* A NUL byte cut the line short ("slots = 4\0junk" read as 4); refused, with its line. */
    static const char nul_text[] = "[ring]\nslots = 4\0junk\n";
    expect_path_error(write_tmp_bytes("nul.ini", nul_text, sizeof nul_text - 1), ":2: NUL byte");
    /* Paths and names reach logs and terminals: a control character in a string value is refused,
     * in the file (an escape in a path) and in an override (a newline) */
    static const char esc_text[] = "[cluster]\nstate_dir = /var/lib/\x1b[31mx\n";
    expect_path_error(write_tmp_bytes("esc.ini", esc_text, sizeof esc_text - 1),
                      ":2: cluster.state_dir: a control character (0x1b) at byte 9");
    CHECK(cfg_set(&cfg, "drafter.checkpoint_dir=/c\nx", err, sizeof err) < 0);
    CHECK_CONTAINS(err, "a control character (0x0a)");
    /* C1's controls too (CSI, U+009B), and bytes that are no UTF-8 (status's JSON would be invalid);
     * UTF-8 text is fine */
    CHECK(cfg_set(&cfg, "cluster.state_dir=/var/lib/\xc2\x9b" "31mx", err, sizeof err) < 0);
    CHECK_CONTAINS(err, "cluster.state_dir: a control character (U+009B) at byte 9");
    CHECK(cfg_set(&cfg, "model.path=/models/caf\xe9", err, sizeof err) < 0);
    CHECK_CONTAINS(err, "model.path: not UTF-8 text (byte 0xe9 at byte 11)");
    CHECK_OK(cfg_set(&cfg, "model.path=/models/caf\xc3\xa9", err, sizeof err));
    static char zeros[10240];
    expect_path_error(write_tmp_bytes("zeros.ini", zeros, sizeof zeros), ":1: NUL byte");
    /* Config files are small: a huge one is refused before parsing. */
    static char big[(1 << 20) + 1];
    memset(big, '#', sizeof big);
    big[0] = '\n';
    expect_path_error(write_tmp_bytes("big.ini", big, sizeof big), ": larger than 1048576 bytes");

    /* A key twice in the file is an error (the first edit silently lost); -o still overrides. */
    expect_error("[ring]\nslots = 4\n\nslots = 8\n", ":4: ring.slots: set twice (first at line 2)");
    expect_error("[ring]\nslots = 4\n[data]\nseed = 1\n[ring]\nslots = 8\n",
                 ":6: ring.slots: set twice (first at line 2)");
    p = write_tmp("dup_ok.ini", "[ring]\nslots = 4\n[data]\nseed = 1\n[ring]\nmax_seqs = 8\n");
    CHECK_OK(cfg_load(&cfg, p, err, sizeof err));
    CHECK_INT(cfg.ring.slots, ==, 4);
    CHECK_INT(cfg.ring.max_seqs, ==, 8);
    CHECK_OK(cfg_set(&cfg, "ring.slots=6", err, sizeof err));
    CHECK_OK(cfg_set(&cfg, "ring.slots=7", err, sizeof err));
    CHECK_INT(cfg.ring.slots, ==, 7);

    /* cluster.name goes into file and shm names: a safe, short name only. */
    expect_error("[cluster]\nname = a/b\n",
                 ":2: cluster.name: 'a/b': not a cluster name: 1-47 characters (letters, digits, '_', '-', '.'; "
                 "not starting with '.')");
    expect_error("[cluster]\nname =\n", ":2: cluster.name: '': not a cluster name");
    expect_error("[cluster]\nname = a b\n", ":2: cluster.name: 'a b': not a cluster name");
    expect_error("[cluster]\nname = ..\n", ":2: cluster.name: '..': not a cluster name");
    expect_error("[cluster]\nname = .hidden\n", "cluster.name: '.hidden': not a cluster name");
    expect_error("[cluster]\nname = a*\n", "cluster.name: 'a*': not a cluster name");
    char name48[49], name_text[128];
    memset(name48, 'n', 48);
    name48[48] = 0;
    snprintf(name_text, sizeof name_text, "[cluster]\nname = %s\n", name48);
    expect_error(name_text, "not a cluster name: 1-47 characters");
    name48[47] = 0;     /* 47 fits: "/dflash-<name>-coll" and the ring's name */
    snprintf(name_text, sizeof name_text, "[cluster]\nname = %s\n", name48);
    p = write_tmp("name.ini", name_text);
    CHECK_OK(cfg_load(&cfg, p, err, sizeof err));
    CHECK_STR(cfg.cluster.name, name48);
    CHECK_OK(cfg_set(&cfg, "cluster.name=t12345x678.a-b_C", err, sizeof err));
    CHECK(cfg_set(&cfg, "cluster.name=../x", err, sizeof err) < 0);
    CHECK_CONTAINS(err, "override cluster.name: '../x': not a cluster name");
    CHECK_STR(cfg.cluster.name, "t12345x678.a-b_C");     /* a refused value leaves the old one */

    /* model.capture_layers: no empty items, no id twice, and a count limit that says so. */
    expect_error("[model]\ncapture_layers = 1,1\n", ":2: model.capture_layers: '1,1': layer id 1 given twice");
    expect_error("[model]\ncapture_layers = 1,,2\n", ":2: model.capture_layers: '1,,2': empty item 2");
    expect_error("[model]\ncapture_layers = 1,2,\n", "model.capture_layers: '1,2,': empty item 3");
    expect_error("[model]\ncapture_layers = ,1\n", "model.capture_layers: ',1': empty item 1");
    expect_error("[model]\ncapture_layers = 1,x\n", "model.capture_layers: '1,x': item 2 is not a layer id");
    expect_error("[model]\ncapture_layers = -1\n", "model.capture_layers: '-1': item 1 is not a layer id");
    char list[256] = "", list_text[300];
    for (int i = 0; i < 65; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", i ? "," : "", i);
    snprintf(list_text, sizeof list_text, "[model]\ncapture_layers = %s\n", list);
    expect_error(list_text, ":2: model.capture_layers: more than 64 layer ids");
    *strrchr(list, ',') = 0;    /* 64 ids: the most the ring, target and drafter take */
    snprintf(list_text, sizeof list_text, "[model]\ncapture_layers = %s\n", list);
    p = write_tmp("layers.ini", list_text);
    CHECK_OK(cfg_load(&cfg, p, err, sizeof err));
    int ids64[64];
    CHECK_INT(cfg_parse_int_list(cfg.model.capture_layers, ids64, 64), ==, 64);
    CHECK(cfg_set(&cfg, "model.capture_layers=3, 3", err, sizeof err) < 0);
    CHECK_CONTAINS(err, "override model.capture_layers: '3, 3': layer id 3 given twice");
    CHECK_OK(cfg_set(&cfg, "model.capture_layers=", err, sizeof err));     /* empty: the default */

    /* The effective config is printed with the shortest decimals that read back exactly. */
    CHECK_OK(cfg_load(&cfg, NULL, err, sizeof err));
    cfg.drafter.lr = 0.1 + 0.2;         /* 0.30000000000000004 */
    cfg.drafter.adam_eps = 1.0000000000000003e-30;
    cfg.drafter.gamma = 100;
    cfg.drafter.grad_clip = 1e6;
    char *out = NULL;
    size_t outlen = 0;
    FILE *mf = open_memstream(&out, &outlen);
    CHECK(mf);
    cfg_print(&cfg, mf, "drafter");
    fclose(mf);
    CHECK_CONTAINS(out, "drafter.beta1 = 0.9\n");
    CHECK_CONTAINS(out, "drafter.min_lr_ratio = 0.1\n");
    CHECK_CONTAINS(out, "drafter.lr = 0.30000000000000004\n");
    CHECK_CONTAINS(out, "drafter.adam_eps = 1.0000000000000003e-30\n");
    CHECK_CONTAINS(out, "drafter.gamma = 100\n");
    CHECK_CONTAINS(out, "drafter.grad_clip = 1000000\n");
    struct dflash_cfg back;
    CHECK_OK(cfg_load(&back, NULL, err, sizeof err));
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        char *eq = strstr(line, " =");
        CHECK(eq);
        char assign[600];
        snprintf(assign, sizeof assign, "%.*s=%s", (int)(eq - line), line, eq[2] ? eq + 3 : "");
        CHECK_OK(cfg_set(&back, assign, err, sizeof err));     /* every printed line reads back */
    }
    free(out);
    CHECK(!memcmp(&back.drafter, &cfg.drafter, sizeof cfg.drafter));     /* bit for bit */

    /* The shipped file loads and documents every key with its default. */
    char shipped[512];
    snprintf(shipped, sizeof shipped, "%s/etc/dflash.ini", test_srcdir());
    CHECK_OK(cfg_load(&cfg, shipped, err, sizeof err));
    FILE *f = fopen(shipped, "r");
    CHECK(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    for (size_t i = 0; i < cfg_nkeys; i++) {
        const struct cfg_key *k = &cfg_keys[i];
        char line[400];
        snprintf(line, sizeof line, "\n%s =%s%s\n", k->key, *k->def ? " " : "", k->def);
        if (!strstr(text, line))
            TEST_FAIL("etc/dflash.ini lacks '%s.%s = %s'", k->section, k->key, k->def);
        if (k->type != CFG_INT && k->type != CFG_DOUBLE)
            continue;
        /* a numeric key's comment line (the one right above it, in its section) ends with its range */
        char sec[80], range[120];
        snprintf(sec, sizeof sec, "\n[%s]\n", k->section);
        const char *in = strstr(text, sec);
        CHECK(in);
        const char *at = strstr(in, line);
        CHECK(at && at > in);
        const char *eol = at, *bol = at;
        while (bol > text && bol[-1] != '\n')
            bol--;
        if (k->type == CFG_INT)
            snprintf(range, sizeof range, " [%.0f, %.0f]", k->min, k->max);
        else
            snprintf(range, sizeof range, " [%.10g, %.10g]", k->min, k->max);
        size_t rl = strlen(range);
        if (*bol != '#' || (size_t)(eol - bol) < rl || memcmp(eol - rl, range, rl))
            TEST_FAIL("etc/dflash.ini: the comment above %s.%s does not end with its range%s: '%.*s'", k->section,
                      k->key, range, (int)(eol - bol), bol);
    }
    /* the config fuzzer's seed is this file as shipped (tools/fuzz.sh --seeds writes it) */
    char seed[512];
    snprintf(seed, sizeof seed, "%s/tests/fuzz/corpus/config/seed-dflash.ini", test_srcdir());
    static char seed_text[1 << 16];
    f = fopen(seed, "r");
    CHECK(f);
    size_t sn = fread(seed_text, 1, sizeof seed_text - 1, f);
    fclose(f);
    if (sn != n || memcmp(seed_text, text, n))
        TEST_FAIL("%s differs from etc/dflash.ini: run tools/fuzz.sh --seeds", seed);
    printf("config ok: %zu keys\n", cfg_nkeys);
    return 0;
}
