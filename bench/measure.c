/*
 * measure [-t SECONDS] OUT CMD [ARGS...]: runs CMD as a child and writes to
 * OUT one line, "WALL_SECONDS CPU_SECONDS MAXRSS_KIB EXIT_CODE TIMED_OUT".
 * CPU is user + sys of the child and every descendant it waited for; MAXRSS
 * is the largest process.
 *
 * Why not measure from Python: a child forked from the Python harness starts
 * with the harness's pages counted in its peak RSS (the kernel keeps the
 * high-water mark across exec), so a small tool would report the harness's
 * size. Forked from this small program, it reports its own.
 *
 * With -t, the child runs in its own process group and the whole group is
 * killed after SECONDS: a tool far slower than the others is recorded as too
 * slow instead of holding the whole suite up.
 */
#include <errno.h>
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

int main(int argc, char **argv) {
    double limit = 0;
    int first = 1;
    if (argc > 2 && strcmp(argv[1], "-t") == 0) {
        limit = atof(argv[2]);
        first = 3;
    }
    if (argc < first + 2) {
        fprintf(stderr, "usage: %s [-t SECONDS] OUT CMD [ARGS...]\n", argv[0]);
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
    double cpu = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
                 usage.ru_stime.tv_usec / 1e6;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    FILE *out = fopen(out_path, "w");
    if (!out) {
        perror("open OUT");
        return 2;
    }
    fprintf(out, "%.6f %.6f %ld %d %d\n", wall, cpu, usage.ru_maxrss, code, (int)timed_out);
    fclose(out);
    return 0;
}
