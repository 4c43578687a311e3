/*
 * measure OUT CMD [ARGS...]: runs CMD as a child and writes to OUT one line,
 * "WALL_SECONDS CPU_SECONDS MAXRSS_KIB EXIT_CODE". CPU is user + sys of the
 * child and every descendant it waited for; MAXRSS is the largest process.
 *
 * Why not measure from Python: a child forked from the Python harness starts
 * with the harness's pages counted in its peak RSS (the kernel keeps the
 * high-water mark across exec), so a small tool would report the harness's
 * size. Forked from this small program, it reports its own.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s OUT CMD [ARGS...]\n", argv[0]);
        return 2;
    }
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 2;
    }
    if (pid == 0) {
        execvp(argv[2], &argv[2]);
        perror("exec");
        _exit(127);
    }
    int status;
    struct rusage usage;
    if (wait4(pid, &status, 0, &usage) < 0) {
        perror("wait4");
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double wall = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
    double cpu = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
                 usage.ru_stime.tv_usec / 1e6;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    FILE *out = fopen(argv[1], "w");
    if (!out) {
        perror("open OUT");
        return 2;
    }
    fprintf(out, "%.6f %.6f %ld %d\n", wall, cpu, usage.ru_maxrss, code);
    fclose(out);
    return 0;
}
