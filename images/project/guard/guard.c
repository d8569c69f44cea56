/*
 * plimsoll's runner guard, preloaded into the project runner (LD_PRELOAD).
 *
 * Before node's main runs, the runner's process is made non-dumpable: the kernel then
 * treats it like a setuid process, so another process of the same uid (every project
 * step runs as the guest uid too) can neither ptrace it nor open its /proc/<pid>/mem,
 * environ or fd entries. That keeps the per-run report key, which the runner holds in
 * memory, away from the steps. A step's own exec makes the step dumpable again; the
 * runner itself stays non-dumpable for its whole life.
 *
 * If the kernel refuses, the runner must not run at all: exit 125, which the daemon
 * reads as "the runner did not report".
 */
#include <sys/prctl.h>
#include <unistd.h>

__attribute__((constructor)) static void plimsoll_runner_guard(void)
{
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 || prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0) {
        _exit(125);
    }
}
