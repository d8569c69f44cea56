/*
 * plimsoll's runner guard, preloaded into the project runner (LD_PRELOAD).
 *
 * It runs before node's main, while the process is still single-threaded, and leaves the
 * runner in a state where the steps it runs cannot read or touch it:
 *
 * 1. Its own identity. A one-shot project container starts as root holding only
 *    CAP_SETUID and CAP_SETGID (plimsolld adds nothing else, and no-new-privileges is set).
 *    The guard moves the runner to uid+1:gid+1 of the guest identity named in
 *    PLIMSOLL_GUEST_ID ("uid:gid"), keeping only those two capabilities so the runner can
 *    start each step as the guest uid. A step's exec then drops every capability (a
 *    non-root exec with no file capabilities under no-new-privileges gets none). A step and
 *    the runner never share a uid: the kernel's ptrace access check (which guards
 *    /proc/<pid>/mem, environ and fd entries) and kill(2) both refuse a step, under gVisor as
 *    under runc. Started as root without PLIMSOLL_GUEST_ID, the runner refuses to run.
 *    Started as a non-root uid (a runner exec'd into a session container), it keeps that
 *    uid and relies on step 2 alone.
 * 2. Non-dumpable. The kernel then treats the runner like a setuid process: even a process
 *    of its own uid can neither ptrace it nor open its /proc/<pid>/mem (gVisor keeps
 *    fd entries and environ open to the same uid, which is why step 1 exists).
 *
 * Any failure exits 125 before node runs, which the daemon reads as "the runner did not
 * report": nothing ran.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define GUARD_FAILED 125
/* Where the project image installs this library. */
#define GUARD_PATH "/usr/local/lib/plimsoll-runner-guard.so"
/* The guest uid and gid bounds of providers.md §5.2 (uid+1 must also fit). */
#define MAX_GUEST_ID 65532UL

/* Parses "uid:gid" (decimal, each 1..MAX_GUEST_ID). */
static int parse_guest(const char *text, unsigned long *uid, unsigned long *gid)
{
    char *end = NULL;
    errno = 0;
    *uid = strtoul(text, &end, 10);
    if (errno != 0 || end == text || *end != ':' || *uid == 0 || *uid > MAX_GUEST_ID) {
        return -1;
    }
    const char *rest = end + 1;
    *gid = strtoul(rest, &end, 10);
    if (errno != 0 || end == rest || *end != '\0' || *gid == 0 || *gid > MAX_GUEST_ID) {
        return -1;
    }
    return 0;
}

/* Sets the effective and permitted capability sets to exactly CAP_SETUID and CAP_SETGID,
 * with nothing inheritable. */
static int keep_setid_caps_only(void)
{
    struct __user_cap_header_struct header = {
        .version = _LINUX_CAPABILITY_VERSION_3,
        .pid = 0,
    };
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    memset(data, 0, sizeof(data));
    data[0].effective = (1U << CAP_SETUID) | (1U << CAP_SETGID);
    data[0].permitted = data[0].effective;
    return (int)syscall(SYS_capset, &header, data);
}

/* 0 when the effective and permitted sets are exactly CAP_SETUID and CAP_SETGID and the
 * inheritable set is empty. */
static int holds_exactly_setid_caps(void)
{
    struct __user_cap_header_struct header = {
        .version = _LINUX_CAPABILITY_VERSION_3,
        .pid = 0,
    };
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    memset(data, 0, sizeof(data));
    if (syscall(SYS_capget, &header, data) != 0) {
        return -1;
    }
    const __u32 want = (1U << CAP_SETUID) | (1U << CAP_SETGID);
    if (data[0].effective != want || data[0].permitted != want || data[0].inheritable != 0) {
        return -1;
    }
    for (int i = 1; i < _LINUX_CAPABILITY_U32S_3; i++) {
        if (data[i].effective != 0 || data[i].permitted != 0 || data[i].inheritable != 0) {
            return -1;
        }
    }
    return 0;
}

/* Moves a root runner to uid+1:gid+1 of the guest identity; 0 on success. */
static int become_runner_identity(void)
{
    const char *guest = getenv("PLIMSOLL_GUEST_ID");
    unsigned long uid = 0;
    unsigned long gid = 0;
    if (guest == NULL || parse_guest(guest, &uid, &gid) != 0) {
        return -1;
    }
    const uid_t runner_uid = (uid_t)(uid + 1);
    const gid_t runner_gid = (gid_t)(gid + 1);
    /* Keep the permitted set across the uid change, then trim it to the two we need. */
    if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0 || setgroups(0, NULL) != 0 ||
        setresgid(runner_gid, runner_gid, runner_gid) != 0 ||
        setresuid(runner_uid, runner_uid, runner_uid) != 0 || keep_setid_caps_only() != 0 ||
        prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) != 0) {
        return -1;
    }
    /* The ambient set is a subset of permitted and inheritable, so the empty inheritable set
     * above already emptied it; clearing it is a second belt. gVisor has no ambient
     * capabilities and answers EINVAL, which is the same outcome. */
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) {
        return -1;
    }
    if (holds_exactly_setid_caps() != 0) {
        return -1;
    }
    uid_t ruid, euid, suid;
    gid_t rgid, egid, sgid;
    if (getresuid(&ruid, &euid, &suid) != 0 || getresgid(&rgid, &egid, &sgid) != 0) {
        return -1;
    }
    if (ruid != runner_uid || euid != runner_uid || suid != runner_uid || rgid != runner_gid ||
        egid != runner_gid || sgid != runner_gid) {
        return -1;
    }
    return 0;
}

__attribute__((constructor)) static void plimsoll_runner_guard(void)
{
    if (geteuid() == 0 || getuid() == 0) {
        if (become_runner_identity() != 0) {
            _exit(GUARD_FAILED);
        }
    }
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 || prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0) {
        _exit(GUARD_FAILED);
    }
    /* The preload is for this process alone: the program never sees it in its environment,
     * so what it starts (a step, a cell's subprocess, a snippet's children) does not inherit
     * it. The loader has already read it. */
    const char *preload = getenv("LD_PRELOAD");
    if (preload != NULL && strcmp(preload, GUARD_PATH) == 0 && unsetenv("LD_PRELOAD") != 0) {
        _exit(GUARD_FAILED);
    }
}
