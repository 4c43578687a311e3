/*
 * The sandbox process of the e2e harness's real nodes (what a cluster's
 * pause image is): it holds a pod's namespaces, reaps the orphans a
 * container leaves, and exits at once on SIGINT or SIGTERM so that a pod
 * is torn down without waiting out the runtime's kill timeout.
 *
 * Built statically by hack/images.sh --test-images; no image is pulled here.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal) { _exit(128 + signal); }

static void reap(int signal) {
  (void)signal;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction on_stop = {.sa_handler = stop};
  struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0 ||
      sigaction(SIGCHLD, &on_child, NULL) < 0) {
    return 1;
  }
  for (;;) {
    pause();
  }
}
