/*
 * measure [-t SECONDS] [-c CPUS] OUT CMD [ARGS...]: runs CMD as a child and writes to
 * OUT one line, "WALL_SECONDS CPU_SECONDS MAXRSS_KIB EXIT_CODE TIMED_OUT
 * USER_SECONDS SYSTEM_SECONDS". CPU is user + sys of the child and every
 * descendant it waited for (then each apart); MAXRSS is the largest process.
 *
 * Why not measure from Python: a child forked from the Python harness starts
 * with the harness's pages counted in its peak RSS (the kernel keeps the
 * high-water mark across exec), so a small tool would report the harness's
 * size. Forked from this small program, it reports its own.
 *
 * With -t, the child runs in its own process group and the whole group is
 * killed after SECONDS: a tool far slower than the others is recorded as too
 * slow instead of holding the whole suite up.
 *
 * With -c (a CPU list such as "0" or "0-3,6"), the child is pinned to those
 * CPUs before it execs CMD, as `taskset -c CPUS CMD` would, and the tree
 * inherits the pinning: the suite's pinned placement keeps the tool off the
 * object store's cores. Done here rather than by prefixing taskset so that
 * the measured process is the tool from its first instruction.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t timed_out = 0;
static pid_t child = 0;

static void on_alarm(int sig) {
    (void)sig;
    timed_out = 1;
    if (child > 0) kill(-child, SIGKILL);
}

/* Parses a CPU list ("0", "0-3,6") into set; 0 when it is malformed or empty. */
static int parse_cpus(const char *list, cpu_set_t *set) {
    CPU_ZERO(set);
    const char *p = list;
    while (*p) {
        char *end;
        long lo = strtol(p, &end, 10), hi = lo;
        if (end == p || lo < 0) return 0;
        p = end;
        if (*p == '-') {
            hi = strtol(p + 1, &end, 10);
            if (end == p + 1 || hi < lo) return 0;
            p = end;
        }
        if (hi >= CPU_SETSIZE) return 0;
        for (long cpu = lo; cpu <= hi; cpu++) CPU_SET((int)cpu, set);
        if (*p == ',') p++;
        else if (*p) return 0;
    }
    return CPU_COUNT(set) > 0;
}

int main(int argc, char **argv) {
    double limit = 0;
    const char *cpus = NULL;
    int first = 1;
    while (argc > first + 1 && argv[first][0] == '-') {
        if (strcmp(argv[first], "-t") == 0) limit = atof(argv[first + 1]);
        else if (strcmp(argv[first], "-c") == 0) cpus = argv[first + 1];
        else break;
        first += 2;
    }
    if (argc < first + 2) {
        fprintf(stderr, "usage: %s [-t SECONDS] [-c CPUS] OUT CMD [ARGS...]\n", argv[0]);
        return 2;
    }
    cpu_set_t cpu_set;
    if (cpus && !parse_cpus(cpus, &cpu_set)) {
        fprintf(stderr, "measure: bad CPU list '%s'\n", cpus);
        return 2;
    }
    const char *out_path = argv[first];
    char **cmd = &argv[first + 1];
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 2;
    }
    if (pid == 0) {
        if (limit > 0) setpgid(0, 0);
        if (cpus && sched_setaffinity(0, sizeof cpu_set, &cpu_set) != 0) {
            perror("sched_setaffinity");
            _exit(127);
        }
        execvp(cmd[0], cmd);
        perror("exec");
        _exit(127);
    }
    if (limit > 0) {
        setpgid(pid, pid); /* also here: whichever of parent and child runs first */
        child = pid;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm;
        sigaction(SIGALRM, &sa, NULL);
        struct itimerval timer = {{0, 0}, {(time_t)limit, (suseconds_t)((limit - (time_t)limit) * 1e6)}};
        setitimer(ITIMER_REAL, &timer, NULL);
    }
    int status;
    struct rusage usage;
    while (wait4(pid, &status, 0, &usage) < 0) {
        if (errno != EINTR) {
            perror("wait4");
            return 2;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double wall = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
    double user = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6;
    double sys = usage.ru_stime.tv_sec + usage.ru_stime.tv_usec / 1e6;
    double cpu = user + sys;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    FILE *out = fopen(out_path, "w");
    if (!out) {
        perror("open OUT");
        return 2;
    }
    fprintf(out, "%.6f %.6f %ld %d %d %.6f %.6f\n", wall, cpu, usage.ru_maxrss, code, (int)timed_out, user, sys);
    fclose(out);
    return 0;
}
