/*
 * fakenvml.c - the simulated host's libnvidia-ml.so.1.
 *
 * Serves the device state of a simulated GPU host (gpugate_sim/device.py) to any NVML
 * caller, above all the real pynvml, so the gate's NVML code runs unchanged without a GPU.
 * The few NVML types are declared here by hand and their sizes pinned with _Static_assert;
 * nothing of nvml.h is copied.
 *
 * Input
 *   The file named by $GPUGATE_FAKE_NVML_STATE, re-read and re-parsed on every call (it is
 *   small, and writers replace it atomically), in the format documented in
 *   gpugate_sim/device.py. The parse goes into a fresh structure that is swapped in under
 *   the library's one mutex; handles are resolved against it under the same mutex, so a
 *   caller never sees half of one state and half of another.
 *
 * When the state cannot be used
 *   A missing variable, a missing or unreadable file, or a file that does not parse makes
 *   nvmlInit_v2/nvmlInitWithFlags return NVML_ERROR_DRIVER_NOT_LOADED (9) and every other
 *   call that needs the state NVML_ERROR_UNKNOWN (999). The reason is written once to
 *   stderr as "fakenvml: <file>: line <n>: <what>" (again only when it changes).
 *
 * Semantics (as the real library documents them)
 *   - Init is reference counted; every call but nvmlErrorString and nvmlShutdown returns
 *     NVML_ERROR_UNINITIALIZED while the count is 0; an extra nvmlShutdown is a SUCCESS.
 *     `init_error N` makes init fail with N. Init flags are accepted and ignored.
 *   - Strings: NVML_ERROR_INSUFFICIENT_SIZE when the buffer cannot hold the text and its NUL.
 *   - Handles point into a static array, stable for the life of the process; an index or
 *     handle of no current device is NVML_ERROR_INVALID_ARGUMENT.
 *   - Memory: v2 used = base_used + bytes of listed processes; free = total - reserved -
 *     used (0 when negative); v1 used = v2 used + reserved. v2 needs version 0x02000028,
 *     else NVML_ERROR_ARGUMENT_VERSION_MISMATCH.
 *   - Processes: `proc` lines of kind C are compute, G graphics, CG both. With `check_pids 1`
 *     a process is listed, and its bytes counted, only while /proc/<pid>/stat exists and its
 *     state is not Z or X: the driver frees a context when its process exits. Sizing
 *     protocol: none -> SUCCESS with count 0; *count too small or infos NULL -> count set to
 *     the number, INSUFFICIENT_SIZE; else the entries are written, SUCCESS. Instance ids are
 *     0xFFFFFFFF (MIG off); -1 bytes is NVML_VALUE_NOT_AVAILABLE. MPS lists are empty.
 *   - MIG is not supported (GeForce): mode and MIG handle queries return NOT_SUPPORTED.
 *   - `fail <gpu|*> <symbol> <code>` makes that symbol return that code for that device
 *     (`*`: every device, and the symbols that take no device).
 *   - `stall <gpu|*> <symbol> <milliseconds>` makes that symbol block that long before it
 *     answers, holding the library's lock as a hung driver call holds the driver's.
 *   - With $GPUGATE_FAKE_NVML_CPU_FILE set, the thread CPU time every call took is added up
 *     in that 8-byte file, mapped shared, so a benchmark can tell the library's cost (its
 *     re-reading of the state file) apart from what its caller spends.
 *   - `lost <gpu|*>`: the device fell off the bus; every call on it returns
 *     NVML_ERROR_GPU_IS_LOST. Once a call has seen it lost, it stays lost for this
 *     initialisation even when the line is gone: only a full nvmlShutdown (count 0) and a
 *     new init see it again, as with a real GPU after a reset.
 */

#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ---- NVML types, declared here; layouts match nvml.h and pynvml's ctypes structures ---- */

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

struct nvmlDevice_st {
    char unused;
};
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
#define NVML_VALUE_NOT_AVAILABLE_ULL (~0ULL)
#define NO_INSTANCE 0xFFFFFFFFu

_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t is 24 bytes");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t is 40 bytes");
_Static_assert(nvmlMemory_v2 == 0x02000028u, "nvmlMemory_v2 version constant");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t is 24 bytes");
_Static_assert(sizeof(nvmlUtilization_t) == 8, "nvmlUtilization_t is 8 bytes");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t is 68 bytes");

/* ---- the exported API (every other NVML symbol is missing: FUNCTION_NOT_FOUND) ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
const char *nvmlErrorString(nvmlReturn_t result);
const char *gpugateSimulatedHost(void);
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length);
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length);
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion);
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion);
nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                      unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                      unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos);
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                        unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos);
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode);
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count);
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice);
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice);
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                          nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization);
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power);

/* ---- the parsed state ---- */

/* Limits shared with gpugate_sim/device.py; they fit NVML's own buffer sizes. */
#define MAX_DEVICES 16
#define DRIVER_LEN 80   /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */
#define DEVICE_STR_LEN 96 /* NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define PROC_NAME_LEN 256
#define SYMBOL_LEN 128
#define MAX_STATE_BYTES (8u << 20)

/* Every device of a simulated host claims to be this PCI function (an RTX 4080, AD103). */
#define PCI_DEVICE_ID 0x270410DEu
#define PCI_SUBSYSTEM_ID 0x167A10DEu

enum { KIND_COMPUTE = 1, KIND_GRAPHICS = 2 };

struct sim_device {
    int present;
    int line;
    unsigned long long total, reserved, base_used;
    char uuid[DEVICE_STR_LEN];
    char name[DEVICE_STR_LEN];
    unsigned int util_gpu, util_memory;
    unsigned int power_mw;
};

struct sim_proc {
    unsigned int gpu;
    unsigned int kinds;
    unsigned int pid;
    int bytes_known;
    unsigned long long bytes;
    char name[PROC_NAME_LEN];
};

struct sim_fail {
    int gpu; /* -1: every device */
    char symbol[SYMBOL_LEN];
    int code;               /* 0 for a stall */
    unsigned int stall_ms;  /* 0 for an error */
};

struct sim_state {
    char driver[DRIVER_LEN];
    int cuda;
    int init_error;
    int check_pids;
    unsigned int lost; /* bit per device */
    unsigned int ndevices;
    struct sim_device devices[MAX_DEVICES];
    struct sim_proc *procs;
    size_t nprocs, cap_procs;
    struct sim_fail *fails;
    size_t nfails, cap_fails;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_refcount;
static struct sim_state *g_state;
static struct nvmlDevice_st g_handles[MAX_DEVICES];
static char g_last_error[512];
static unsigned int g_lost_seen; /* devices seen lost since the count was last 0 */

static void state_free(struct sim_state *s)
{
    if (s == NULL)
        return;
    free(s->procs);
    free(s->fails);
    free(s);
}

/* ---- parsing ---- */

struct parser {
    const char *path;
    int line;
    char error[400];
};

__attribute__((format(printf, 2, 3)))
static int parse_error(struct parser *p, const char *fmt, ...)
{
    char what[300];
    va_list args;
    va_start(args, fmt);
    vsnprintf(what, sizeof what, fmt, args);
    va_end(args);
    snprintf(p->error, sizeof p->error, "line %d: %s", p->line, what);
    return -1;
}

/* Copies the next whitespace-delimited word of *cursor into out; 0 when there is none. */
static int next_word(const char **cursor, char *out, size_t size)
{
    const char *s = *cursor;
    size_t n = 0;
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s == '\0')
        return 0;
    while (*s != '\0' && *s != ' ' && *s != '\t') {
        if (n + 1 < size)
            out[n] = *s;
        n++;
        s++;
    }
    /* A word that does not fit is reported as empty so the caller rejects it. */
    out[n + 1 <= size ? n : 0] = '\0';
    *cursor = s;
    return 1;
}

/* The rest of the line without surrounding blanks: a name may contain spaces and '#'. */
static const char *rest_of_line(const char *s, size_t *len)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    *len = n;
    return s;
}

static int parse_ull(const char *word, unsigned long long max, unsigned long long *out)
{
    if (word[0] == '\0')
        return -1;
    for (const char *c = word; *c; c++)
        if (!isdigit((unsigned char)*c))
            return -1;
    errno = 0;
    unsigned long long v = strtoull(word, NULL, 10);
    if (errno != 0 || v > max)
        return -1;
    *out = v;
    return 0;
}

static int parse_uint(const char *word, unsigned int max, unsigned int *out)
{
    unsigned long long v;
    if (parse_ull(word, max, &v) != 0)
        return -1;
    *out = (unsigned int)v;
    return 0;
}

static int parse_gpu(struct parser *p, const char *word, int allow_any, int *out)
{
    unsigned int gpu;
    if (allow_any && strcmp(word, "*") == 0) {
        *out = -1;
        return 0;
    }
    if (parse_uint(word, MAX_DEVICES - 1, &gpu) != 0)
        return parse_error(p, "bad GPU index '%s'", word);
    *out = (int)gpu;
    return 0;
}

/* A GPU index (or `*`) that refers to a device declared on an earlier line. */
static int parse_declared_gpu(struct parser *p, const struct sim_state *s, const char *word,
                              int allow_any, int *out)
{
    if (parse_gpu(p, word, allow_any, out) != 0)
        return -1;
    if (*out >= 0 && !s->devices[*out].present)
        return parse_error(p, "no device %s is declared above this line", word);
    return 0;
}

static int expect_end(struct parser *p, const char *cursor)
{
    char extra[64];
    if (next_word(&cursor, extra, sizeof extra))
        return parse_error(p, "unexpected '%s' at the end of the line", extra);
    return 0;
}

static int copy_name(struct parser *p, const char *cursor, char *out, size_t size,
                     const char *what, int required)
{
    size_t len;
    const char *name = rest_of_line(cursor, &len);
    if (len == 0 && required)
        return parse_error(p, "%s is missing", what);
    if (len + 1 > size)
        return parse_error(p, "%s is too long", what);
    memcpy(out, name, len);
    out[len] = '\0';
    return 0;
}

static int parse_device(struct parser *p, struct sim_state *s, const char *cur)
{
    char w[4][64];
    int gpu = 0;
    unsigned long long total, reserved, base;
    for (int i = 0; i < 4; i++)
        if (!next_word(&cur, w[i], sizeof w[i]))
            return parse_error(p, "device: expected <index> <total> <reserved> <base_used> "
                                  "<uuid> <name>");
    if (parse_gpu(p, w[0], 0, &gpu) != 0)
        return -1;
    if (parse_ull(w[1], ULLONG_MAX, &total) != 0)
        return parse_error(p, "device: bad total '%s'", w[1]);
    if (parse_ull(w[2], ULLONG_MAX, &reserved) != 0)
        return parse_error(p, "device: bad reserved '%s'", w[2]);
    if (parse_ull(w[3], ULLONG_MAX, &base) != 0)
        return parse_error(p, "device: bad base_used '%s'", w[3]);
    struct sim_device *d = &s->devices[gpu];
    if (d->present)
        return parse_error(p, "device %s is declared twice", w[0]);
    if (!next_word(&cur, d->uuid, sizeof d->uuid) || d->uuid[0] == '\0')
        return parse_error(p, "device: uuid missing or too long");
    if (copy_name(p, cur, d->name, sizeof d->name, "device name", 1) != 0)
        return -1;
    d->present = 1;
    d->line = p->line;
    d->total = total;
    d->reserved = reserved;
    d->base_used = base;
    return 0;
}

static int parse_proc(struct parser *p, struct sim_state *s, const char *cur)
{
    char w[4][64];
    int gpu = 0;
    struct sim_proc proc;
    memset(&proc, 0, sizeof proc);
    for (int i = 0; i < 4; i++)
        if (!next_word(&cur, w[i], sizeof w[i]))
            return parse_error(p, "proc: expected <gpu> <C|G|CG> <pid> <bytes|-1> [name]");
    if (parse_declared_gpu(p, s, w[0], 0, &gpu) != 0)
        return -1;
    proc.gpu = (unsigned int)gpu;
    if (strcmp(w[1], "C") == 0)
        proc.kinds = KIND_COMPUTE;
    else if (strcmp(w[1], "G") == 0)
        proc.kinds = KIND_GRAPHICS;
    else if (strcmp(w[1], "CG") == 0)
        proc.kinds = KIND_COMPUTE | KIND_GRAPHICS;
    else
        return parse_error(p, "proc: kind must be C, G or CG, not '%s'", w[1]);
    if (parse_uint(w[2], INT_MAX, &proc.pid) != 0 || proc.pid == 0)
        return parse_error(p, "proc: bad pid '%s'", w[2]);
    if (strcmp(w[3], "-1") == 0) {
        proc.bytes_known = 0;
    } else if (parse_ull(w[3], ULLONG_MAX - 1, &proc.bytes) == 0) {
        proc.bytes_known = 1;
    } else {
        return parse_error(p, "proc: bad byte count '%s'", w[3]);
    }
    if (copy_name(p, cur, proc.name, sizeof proc.name, "process name", 0) != 0)
        return -1;
    if (s->nprocs == s->cap_procs) {
        size_t cap = s->cap_procs ? s->cap_procs * 2 : 16;
        struct sim_proc *grown = realloc(s->procs, cap * sizeof *grown);
        if (grown == NULL)
            return parse_error(p, "out of memory");
        s->procs = grown;
        s->cap_procs = cap;
    }
    s->procs[s->nprocs++] = proc;
    return 0;
}

/* `fail <gpu|*> <symbol> <code>`, or `stall <gpu|*> <symbol> <milliseconds>`. */
static int parse_fail(struct parser *p, struct sim_state *s, const char *cur, int is_stall)
{
    char w[3][SYMBOL_LEN];
    const char *what = is_stall ? "stall" : "fail";
    struct sim_fail fail;
    unsigned int value;
    memset(&fail, 0, sizeof fail);
    for (int i = 0; i < 3; i++)
        if (!next_word(&cur, w[i], sizeof w[i]))
            return parse_error(p, "%s: expected <gpu|*> <symbol> %s", what,
                               is_stall ? "<milliseconds>" : "<code>");
    if (parse_declared_gpu(p, s, w[0], 1, &fail.gpu) != 0)
        return -1;
    if (w[1][0] == '\0')
        return parse_error(p, "%s: symbol name too long", what);
    if (parse_uint(w[2], is_stall ? 3600000 : INT_MAX, &value) != 0 || value == 0)
        return parse_error(p, "%s: bad %s '%s'", what,
                           is_stall ? "milliseconds" : "NVML error code", w[2]);
    if (expect_end(p, cur) != 0)
        return -1;
    strcpy(fail.symbol, w[1]);
    if (is_stall)
        fail.stall_ms = value;
    else
        fail.code = (int)value;
    if (s->nfails == s->cap_fails) {
        size_t cap = s->cap_fails ? s->cap_fails * 2 : 8;
        struct sim_fail *grown = realloc(s->fails, cap * sizeof *grown);
        if (grown == NULL)
            return parse_error(p, "out of memory");
        s->fails = grown;
        s->cap_fails = cap;
    }
    s->fails[s->nfails++] = fail;
    return 0;
}

/* `util <gpu> <gpu%> <memory%>` or `power <gpu> <milliwatts>` of a declared device. */
static int parse_metric(struct parser *p, struct sim_state *s, const char *cur, int is_power)
{
    char w[3][64];
    int gpu = 0;
    unsigned int a, b = 0;
    int words = is_power ? 2 : 3;
    for (int i = 0; i < words; i++)
        if (!next_word(&cur, w[i], sizeof w[i]))
            return parse_error(p, "%s", is_power ? "power: expected <gpu> <milliwatts>"
                                                 : "util: expected <gpu> <gpu%> <memory%>");
    if (parse_declared_gpu(p, s, w[0], 0, &gpu) != 0)
        return -1;
    if (is_power) {
        if (parse_uint(w[1], UINT_MAX, &a) != 0)
            return parse_error(p, "power: bad milliwatts '%s'", w[1]);
    } else {
        if (parse_uint(w[1], 100, &a) != 0)
            return parse_error(p, "util: bad GPU percentage '%s'", w[1]);
        if (parse_uint(w[2], 100, &b) != 0)
            return parse_error(p, "util: bad memory percentage '%s'", w[2]);
    }
    if (expect_end(p, cur) != 0)
        return -1;
    if (is_power) {
        s->devices[gpu].power_mw = a;
    } else {
        s->devices[gpu].util_gpu = a;
        s->devices[gpu].util_memory = b;
    }
    return 0;
}

/* Cuts a trailing comment off a directive line that has no free-text name. */
static void cut_comment(char *line)
{
    char *hash = strchr(line, '#');
    if (hash != NULL)
        *hash = '\0';
}

static int parse_line(struct parser *p, struct sim_state *s, char *line)
{
    char word[32];
    const char *cur = line;
    while (*cur == ' ' || *cur == '\t')
        cur++;
    if (*cur == '\0' || *cur == '#')
        return 0;
    next_word(&cur, word, sizeof word);
    if (strcmp(word, "device") == 0)
        return parse_device(p, s, cur);
    if (strcmp(word, "proc") == 0)
        return parse_proc(p, s, cur);
    cut_comment(line);
    if (strcmp(word, "fail") == 0 || strcmp(word, "stall") == 0)
        return parse_fail(p, s, cur, word[0] == 's');
    if (strcmp(word, "lost") == 0) {
        char gpu_word[64];
        int gpu;
        if (!next_word(&cur, gpu_word, sizeof gpu_word))
            return parse_error(p, "lost: expected <gpu|*>");
        if (parse_declared_gpu(p, s, gpu_word, 1, &gpu) != 0 || expect_end(p, cur) != 0)
            return -1;
        s->lost |= gpu < 0 ? ~0u : 1u << gpu;
        return 0;
    }
    if (strcmp(word, "util") == 0 || strcmp(word, "power") == 0)
        return parse_metric(p, s, cur, word[0] == 'p');
    if (strcmp(word, "driver") == 0) {
        if (copy_name(p, cur, s->driver, sizeof s->driver, "driver version", 1) != 0)
            return -1;
        return 0;
    }
    if (strcmp(word, "cuda") == 0 || strcmp(word, "init_error") == 0
        || strcmp(word, "check_pids") == 0) {
        char value[64];
        unsigned int v;
        unsigned int max = word[1] == 'h' ? 1 : INT_MAX;
        if (!next_word(&cur, value, sizeof value) || parse_uint(value, max, &v) != 0)
            return parse_error(p, "bad value for %s", word);
        if (expect_end(p, cur) != 0)
            return -1;
        if (word[0] == 'c' && word[1] == 'u')
            s->cuda = (int)v;
        else if (word[0] == 'i')
            s->init_error = (int)v;
        else
            s->check_pids = (int)v;
        return 0;
    }
    return parse_error(p, "unknown directive '%s'", word);
}

/* Device indexes must run 0..n-1, as NVML's do. */
static int count_devices(struct parser *p, struct sim_state *s)
{
    unsigned int n = 0;
    while (n < MAX_DEVICES && s->devices[n].present)
        n++;
    for (unsigned int i = n; i < MAX_DEVICES; i++)
        if (s->devices[i].present) {
            p->line = s->devices[i].line;
            return parse_error(p, "device indexes must run 0, 1, 2, ...: device %u is missing", n);
        }
    s->ndevices = n;
    return 0;
}

static int parse_text(struct parser *p, struct sim_state *s, char *text)
{
    char *line = text;
    strcpy(s->driver, "550.54.15");
    s->cuda = 12040;
    s->check_pids = 1;
    for (p->line = 1; line != NULL; p->line++) {
        char *newline = strchr(line, '\n');
        if (newline != NULL)
            *newline = '\0';
        size_t len = strlen(line);
        if (len > 0 && line[len - 1] == '\r')
            line[len - 1] = '\0';
        if (parse_line(p, s, line) != 0)
            return -1;
        line = newline != NULL ? newline + 1 : NULL;
    }
    return count_devices(p, s);
}

/* Reads the whole state file into a NUL-terminated buffer the caller frees. */
static char *read_file(const char *path, char *error, size_t error_size)
{
    FILE *fh = fopen(path, "rb");
    if (fh == NULL) {
        snprintf(error, error_size, "cannot open: %s", strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf != NULL) {
        size_t got = fread(buf + len, 1, cap - len - 1, fh);
        len += got;
        if (got == 0)
            break;
        if (len + 1 == cap) {
            if (cap >= MAX_STATE_BYTES) {
                snprintf(error, error_size, "larger than %u bytes", MAX_STATE_BYTES);
                free(buf);
                buf = NULL;
                break;
            }
            char *grown = realloc(buf, cap * 2);
            if (grown == NULL) {
                free(buf);
                buf = NULL;
                snprintf(error, error_size, "out of memory");
                break;
            }
            buf = grown;
            cap *= 2;
        }
    }
    if (buf != NULL && ferror(fh)) {
        snprintf(error, error_size, "cannot read: %s", strerror(errno));
        free(buf);
        buf = NULL;
    }
    fclose(fh);
    if (buf != NULL) {
        buf[len] = '\0';
        if (memchr(buf, '\0', len) != NULL) {
            snprintf(error, error_size, "contains a NUL byte");
            free(buf);
            buf = NULL;
        }
    }
    return buf;
}

static void report_locked(const char *path, const char *error)
{
    char message[sizeof g_last_error];
    snprintf(message, sizeof message, "fakenvml: %s: %s", path, error);
    if (strcmp(message, g_last_error) != 0) {
        memcpy(g_last_error, message, sizeof message);
        fprintf(stderr, "%s\n", message);
    }
}

/* Re-reads the state file into g_state. Caller holds g_lock; returns 0 or -1 (reported). */
static int refresh_locked(void)
{
    struct parser p = {.path = getenv("GPUGATE_FAKE_NVML_STATE"), .line = 0, .error = ""};
    if (p.path == NULL || p.path[0] == '\0') {
        report_locked("$GPUGATE_FAKE_NVML_STATE", "not set");
        return -1;
    }
    char *text = read_file(p.path, p.error, sizeof p.error);
    if (text == NULL) {
        report_locked(p.path, p.error);
        return -1;
    }
    struct sim_state *fresh = calloc(1, sizeof *fresh);
    if (fresh == NULL) {
        free(text);
        report_locked(p.path, "out of memory");
        return -1;
    }
    int rc = parse_text(&p, fresh, text);
    free(text);
    if (rc != 0) {
        state_free(fresh);
        report_locked(p.path, p.error);
        return -1;
    }
    state_free(g_state);
    g_state = fresh;
    g_last_error[0] = '\0';
    return 0;
}

/* ---- queries on the current state (all with g_lock held) ---- */

static int pid_alive(unsigned int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *fh = fopen(path, "r");
    if (fh == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, fh);
    fclose(fh);
    buf[n] = '\0';
    /* The command name is in parentheses and may itself contain ") "; the state follows
     * the last one. */
    char *close = strrchr(buf, ')');
    if (close == NULL || close[1] != ' ')
        return 0;
    return close[2] != 'Z' && close[2] != 'X';
}

static int proc_listed(const struct sim_proc *proc)
{
    return !g_state->check_pids || pid_alive(proc->pid);
}

static unsigned long long used_v2(unsigned int gpu)
{
    const struct sim_device *d = &g_state->devices[gpu];
    unsigned long long used = d->base_used;
    for (size_t i = 0; i < g_state->nprocs; i++) {
        const struct sim_proc *proc = &g_state->procs[i];
        if (proc->gpu == gpu && proc->bytes_known && proc_listed(proc))
            used = proc->bytes > ULLONG_MAX - used ? ULLONG_MAX : used + proc->bytes;
    }
    return used;
}

static unsigned long long free_bytes(unsigned int gpu, unsigned long long used)
{
    const struct sim_device *d = &g_state->devices[gpu];
    if (d->reserved >= d->total || used >= d->total - d->reserved)
        return 0;
    return d->total - d->reserved - used;
}

/* An injected error for `symbol` on device `gpu` (-1: a call that takes no device). */
static nvmlReturn_t injected(const char *symbol, int gpu)
{
    for (size_t i = 0; i < g_state->nfails; i++) {
        const struct sim_fail *f = &g_state->fails[i];
        if (f->code != 0 && (f->gpu == -1 || f->gpu == gpu) && strcmp(f->symbol, symbol) == 0)
            return f->code;
    }
    return NVML_SUCCESS;
}

/* How long `symbol` on device `gpu` hangs before it answers (0: it does not). */
static unsigned int stall_ms(const char *symbol, int gpu)
{
    for (size_t i = 0; i < g_state->nfails; i++) {
        const struct sim_fail *f = &g_state->fails[i];
        if (f->stall_ms != 0 && (f->gpu == -1 || f->gpu == gpu)
            && strcmp(f->symbol, symbol) == 0)
            return f->stall_ms;
    }
    return 0;
}

static void sleep_ms(unsigned int ms)
{
    struct timespec left = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&left, &left) != 0 && errno == EINTR)
        ;
}

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *value)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t len = strlen(value);
    if (len + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, len + 1);
    return NVML_SUCCESS;
}

/* Common entry of every call that needs the state; device-less calls pass gpu -1. */
static nvmlReturn_t enter_locked(const char *symbol, int gpu)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (refresh_locked() != 0)
        return NVML_ERROR_UNKNOWN;
    if (gpu >= 0 && (unsigned int)gpu >= g_state->ndevices)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int ms = stall_ms(symbol, gpu);
    if (ms != 0)
        sleep_ms(ms);
    if (gpu >= 0) {
        unsigned int bit = 1u << gpu;
        if (g_state->lost & bit)
            g_lost_seen |= bit;
        if (g_lost_seen & bit)
            return NVML_ERROR_GPU_IS_LOST;
    }
    return injected(symbol, gpu);
}

/* The device index of a handle, or -1 when it is not one of ours. */
static int handle_index(nvmlDevice_t device)
{
    uintptr_t base = (uintptr_t)g_handles;
    uintptr_t at = (uintptr_t)device;
    if (device == NULL || at < base)
        return -1;
    uintptr_t offset = (at - base) / sizeof(struct nvmlDevice_st);
    if ((at - base) % sizeof(struct nvmlDevice_st) != 0 || offset >= MAX_DEVICES)
        return -1;
    return (int)offset;
}

/* Enter a device call: resolves the handle inside the lock, against the fresh state. */
static nvmlReturn_t enter_device_locked(const char *symbol, nvmlDevice_t device, int *gpu)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    *gpu = handle_index(device);
    if (*gpu < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    return enter_locked(symbol, *gpu);
}

/* The CPU time spent inside the library, for a benchmark to tell it apart from its caller's:
 * with $GPUGATE_FAKE_NVML_CPU_FILE set, an 8-byte file mapped shared holds the nanoseconds
 * of thread CPU time all calls took so far (another process reads it while this one runs). */
static volatile uint64_t *g_cpu_ns;
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void cpu_counter_open(void)
{
    const char *path = getenv("GPUGATE_FAKE_NVML_CPU_FILE");
    if (path == NULL || *path == '\0')
        return;
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0)
        return;
    if (ftruncate(fd, sizeof(uint64_t)) == 0) {
        void *map = mmap(NULL, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map != MAP_FAILED)
            g_cpu_ns = map;
    }
    close(fd);
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec now;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now) != 0)
        return 0;
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

#define LOCKED(expr)                                                                           \
    do {                                                                                       \
        pthread_once(&g_cpu_once, cpu_counter_open);                                           \
        uint64_t cpu_before_ = g_cpu_ns != NULL ? thread_cpu_ns() : 0;                         \
        pthread_mutex_lock(&g_lock);                                                           \
        nvmlReturn_t locked_result_ = (expr);                                                  \
        if (g_cpu_ns != NULL)                                                                  \
            *g_cpu_ns += thread_cpu_ns() - cpu_before_;                                        \
        pthread_mutex_unlock(&g_lock);                                                         \
        return locked_result_;                                                                 \
    } while (0)

/* ---- init and errors ---- */

static nvmlReturn_t init_locked(const char *symbol)
{
    if (refresh_locked() != 0)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (g_state->init_error != 0)
        return g_state->init_error;
    nvmlReturn_t r = injected(symbol, -1);
    if (r == NVML_SUCCESS)
        g_refcount++;
    return r;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    LOCKED(init_locked(__func__));
}

nvmlReturn_t nvmlInit_v2(void)
{
    LOCKED(init_locked(__func__));
}

static nvmlReturn_t shutdown_locked(void)
{
    if (g_refcount > 0)
        g_refcount--;
    if (g_refcount == 0)
        g_lost_seen = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void)
{
    LOCKED(shutdown_locked());
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt request issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 25: return "Argument version mismatch";
    case 26: return "Deprecated";
    case 27: return "Not Ready";
    case 28: return "GPU not found";
    case 29: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ---- system queries ---- */

static nvmlReturn_t driver_version_locked(char *version, unsigned int length)
{
    nvmlReturn_t r = enter_locked("nvmlSystemGetDriverVersion", -1);
    return r != NVML_SUCCESS ? r : copy_string(version, length, g_state->driver);
}

/* Not NVML: a real libnvidia-ml has no such symbol. A gate that finds it knows its GPUs
 * are a simulated host's (the path of its state file), and keeps its own state apart. */
const char *gpugateSimulatedHost(void)
{
    const char *path = getenv("GPUGATE_FAKE_NVML_STATE");
    return path != NULL ? path : "";
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    LOCKED(driver_version_locked(version, length));
}

static nvmlReturn_t nvml_version_locked(char *version, unsigned int length)
{
    char text[DRIVER_LEN + 16];
    nvmlReturn_t r = enter_locked("nvmlSystemGetNVMLVersion", -1);
    if (r != NVML_SUCCESS)
        return r;
    /* The NVML version is the CUDA major version followed by the driver version. */
    snprintf(text, sizeof text, "%d.%s", g_state->cuda / 1000, g_state->driver);
    return copy_string(version, length, text);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    LOCKED(nvml_version_locked(version, length));
}

static nvmlReturn_t cuda_version_locked(const char *symbol, int *version)
{
    nvmlReturn_t r = enter_locked(symbol, -1);
    if (r != NVML_SUCCESS)
        return r;
    if (version == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = g_state->cuda;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    LOCKED(cuda_version_locked(__func__, cudaDriverVersion));
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    LOCKED(cuda_version_locked(__func__, cudaDriverVersion));
}

/* A process without a name in the state is named by its comm, as the driver would. */
static int read_comm(unsigned int pid, char *out, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *fh = fopen(path, "r");
    if (fh == NULL)
        return -1;
    size_t n = fread(out, 1, size - 1, fh);
    fclose(fh);
    out[n] = '\0';
    if (n > 0 && out[n - 1] == '\n')
        out[n - 1] = '\0';
    return 0;
}

static nvmlReturn_t process_name_locked(unsigned int pid, char *name, unsigned int length)
{
    nvmlReturn_t r = enter_locked("nvmlSystemGetProcessName", -1);
    if (r != NVML_SUCCESS)
        return r;
    for (size_t i = 0; i < g_state->nprocs; i++) {
        const struct sim_proc *proc = &g_state->procs[i];
        if (proc->pid != pid || !proc_listed(proc))
            continue;
        if (proc->name[0] != '\0')
            return copy_string(name, length, proc->name);
        char comm[PROC_NAME_LEN];
        if (read_comm(pid, comm, sizeof comm) != 0)
            return NVML_ERROR_NOT_FOUND;
        return copy_string(name, length, comm);
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    LOCKED(process_name_locked(pid, name, length));
}

/* ---- device enumeration and identity ---- */

static nvmlReturn_t count_locked(unsigned int *count)
{
    nvmlReturn_t r = enter_locked("nvmlDeviceGetCount_v2", -1);
    if (r != NVML_SUCCESS)
        return r;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = g_state->ndevices;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    LOCKED(count_locked(deviceCount));
}

static nvmlReturn_t handle_by_index_locked(unsigned int index, nvmlDevice_t *device)
{
    int gpu = index >= MAX_DEVICES ? MAX_DEVICES : (int)index;
    nvmlReturn_t r = enter_locked("nvmlDeviceGetHandleByIndex_v2", gpu);
    if (r != NVML_SUCCESS)
        return r;
    if (device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_handles[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    LOCKED(handle_by_index_locked(index, device));
}

static nvmlReturn_t handle_by_uuid_locked(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t r = enter_locked("nvmlDeviceGetHandleByUUID", -1);
    if (r != NVML_SUCCESS)
        return r;
    if (uuid == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < g_state->ndevices; i++)
        if (strcmp(g_state->devices[i].uuid, uuid) == 0) {
            r = injected("nvmlDeviceGetHandleByUUID", (int)i);
            if (r == NVML_SUCCESS)
                *device = &g_handles[i];
            return r;
        }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    LOCKED(handle_by_uuid_locked(uuid, device));
}

static nvmlReturn_t index_locked(nvmlDevice_t device, unsigned int *index)
{
    int gpu = 0;
    nvmlReturn_t r = enter_device_locked("nvmlDeviceGetIndex", device, &gpu);
    if (r != NVML_SUCCESS)
        return r;
    if (index == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)gpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    LOCKED(index_locked(device, index));
}

static nvmlReturn_t device_string_locked(const char *symbol, nvmlDevice_t device, char *out,
                                         unsigned int length, int want_uuid)
{
    int gpu = 0;
    nvmlReturn_t r = enter_device_locked(symbol, device, &gpu);
    if (r != NVML_SUCCESS)
        return r;
    const struct sim_device *d = &g_state->devices[gpu];
    return copy_string(out, length, want_uuid ? d->uuid : d->name);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    LOCKED(device_string_locked(__func__, device, name, length, 0));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    LOCKED(device_string_locked(__func__, device, uuid, length, 1));
}

static nvmlReturn_t pci_info_locked(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    int gpu = 0;
    nvmlReturn_t r = enter_device_locked("nvmlDeviceGetPciInfo_v3", device, &gpu);
    if (r != NVML_SUCCESS)
        return r;
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    /* Device n sits on bus n+1, the way a desktop board enumerates its slots. */
    pci->domain = 0;
    pci->bus = (unsigned int)gpu + 1;
    pci->device = 0;
    pci->pciDeviceId = PCI_DEVICE_ID;
    pci->pciSubSystemId = PCI_SUBSYSTEM_ID;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", pci->bus);
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", pci->bus);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    LOCKED(pci_info_locked(device, pci));
}

/* ---- memory ---- */

static nvmlReturn_t memory_v1_locked(nvmlDevice_t device, nvmlMemory_t *memory)
{
    int gpu = 0;
    nvmlReturn_t r = enter_device_locked("nvmlDeviceGetMemoryInfo", device, &gpu);
    if (r != NVML_SUCCESS)
        return r;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_device *d = &g_state->devices[gpu];
    unsigned long long used = used_v2((unsigned int)gpu);
    memory->total = d->total;
    memory->free = free_bytes((unsigned int)gpu, used);
    /* v1 counts the driver's reservation as used. */
    memory->used = used > ULLONG_MAX - d->reserved ? ULLONG_MAX : used + d->reserved;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    LOCKED(memory_v1_locked(device, memory));
}

static nvmlReturn_t memory_v2_locked(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    int gpu = 0;
    nvmlReturn_t r = enter_device_locked("nvmlDeviceGetMemoryInfo_v2", device, &gpu);
    if (r != NVML_SUCCESS)
        return r;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const struct sim_device *d = &g_state->devices[gpu];
    unsigned long long used = used_v2((unsigned int)gpu);
    memory->total = d->total;
    memory->reserved = d->reserved;
    memory->used = used;
    memory->free = free_bytes((unsigned int)gpu, used);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    LOCKED(memory_v2_locked(device, memory));
}

/* ---- running processes ---- */

static nvmlReturn_t processes_locked(const char *symbol, nvmlDevice_t device, unsigned int kind,
                                     unsigned int *count, nvmlProcessInfo_t *infos)
{
    int gpu = 0;
    nvmlReturn_t r = enter_device_locked(symbol, device, &gpu);
    if (r != NVML_SUCCESS)
        return r;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* Liveness is read once per process, so the count and the entries always agree. */
    size_t *listed = malloc((g_state->nprocs + 1) * sizeof *listed);
    if (listed == NULL)
        return NVML_ERROR_UNKNOWN;
    unsigned int n = 0;
    for (size_t i = 0; i < g_state->nprocs; i++) {
        const struct sim_proc *proc = &g_state->procs[i];
        if (proc->gpu == (unsigned int)gpu && (proc->kinds & kind) && proc_listed(proc))
            listed[n++] = i;
    }
    if (n == 0) {
        r = NVML_SUCCESS;
    } else if (infos == NULL || *count < n) {
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        for (unsigned int k = 0; k < n; k++) {
            const struct sim_proc *proc = &g_state->procs[listed[k]];
            infos[k].pid = proc->pid;
            infos[k].usedGpuMemory = proc->bytes_known ? proc->bytes
                                                       : NVML_VALUE_NOT_AVAILABLE_ULL;
            infos[k].gpuInstanceId = NO_INSTANCE;
            infos[k].computeInstanceId = NO_INSTANCE;
        }
        r = NVML_SUCCESS;
    }
    *count = n;
    free(listed);
    return r;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    LOCKED(processes_locked(__func__, device, KIND_COMPUTE, infoCount, infos));
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                      unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    LOCKED(processes_locked(__func__, device, KIND_GRAPHICS, infoCount, infos));
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    LOCKED(processes_locked(__func__, device, KIND_COMPUTE, infoCount, infos));
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                      unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    LOCKED(processes_locked(__func__, device, KIND_GRAPHICS, infoCount, infos));
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                        unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos)
{
    /* No simulated process runs under MPS: kind 0 matches none. */
    LOCKED(processes_locked(__func__, device, 0, infoCount, infos));
}

/* ---- MIG (not supported), utilization, power ---- */

static nvmlReturn_t not_supported_locked(const char *symbol, nvmlDevice_t device)
{
    int gpu = 0;
    nvmlReturn_t r = enter_device_locked(symbol, device, &gpu);
    return r != NVML_SUCCESS ? r : NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode)
{
    (void)currentMode;
    (void)pendingMode;
    LOCKED(not_supported_locked(__func__, device));
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    (void)count;
    LOCKED(not_supported_locked(__func__, device));
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice)
{
    (void)index;
    (void)migDevice;
    LOCKED(not_supported_locked(__func__, device));
}

static nvmlReturn_t is_mig_locked(nvmlDevice_t device, unsigned int *isMigDevice)
{
    int gpu = 0;
    nvmlReturn_t r = enter_device_locked("nvmlDeviceIsMigDeviceHandle", device, &gpu);
    if (r != NVML_SUCCESS)
        return r;
    if (isMigDevice == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    LOCKED(is_mig_locked(device, isMigDevice));
}

static nvmlReturn_t parent_of_mig_locked(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    int gpu = 0;
    (void)device;
    nvmlReturn_t r = enter_device_locked("nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
                                         migDevice, &gpu);
    /* Every handle here is a full GPU, never a MIG instance. */
    return r != NVML_SUCCESS ? r : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                          nvmlDevice_t *device)
{
    LOCKED(parent_of_mig_locked(migDevice, device));
}

static nvmlReturn_t utilization_locked(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    int gpu = 0;
    nvmlReturn_t r = enter_device_locked("nvmlDeviceGetUtilizationRates", device, &gpu);
    if (r != NVML_SUCCESS)
        return r;
    if (utilization == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    utilization->gpu = g_state->devices[gpu].util_gpu;
    utilization->memory = g_state->devices[gpu].util_memory;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    LOCKED(utilization_locked(device, utilization));
}

static nvmlReturn_t power_locked(nvmlDevice_t device, unsigned int *power)
{
    int gpu = 0;
    nvmlReturn_t r = enter_device_locked("nvmlDeviceGetPowerUsage", device, &gpu);
    if (r != NVML_SUCCESS)
        return r;
    if (power == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *power = g_state->devices[gpu].power_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    LOCKED(power_locked(device, power));
}
