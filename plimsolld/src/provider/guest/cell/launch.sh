# plimsoll's cell launcher (providers.md §9.6). plimsolld runs it through the provider's exec
# (on docker under `/usr/bin/env -i PATH=<fixed>`) as
#
#   PLIMSOLL_INTERP_DIR=<dir> PLIMSOLL_WORK=<work> \
#       /bin/sh -c <this script> sh <provider prefix…> <interpreter command…> <dir>
#
# where the provider prefix (docker: the start script, which hands the interpreter the image
# environment, providers.md §5.5) ends in an exec, so the interpreter keeps the PID started
# here. It:
#   1. removes the kernel directory, recreates it mode 700 and makes the FIFOs `out` and `err`;
#   2. changes to the work directory (made first when missing);
#   3. starts the command in a new session with stdin /dev/null and stdout and stderr on the
#      FIFOs (opened read-write, so the open never blocks), in the background;
#   4. polls every 50 ms, up to 400 times, until <dir>/ready holds exactly the child's PID;
#      exits 3 if the child dies first (and 4 if it never gets ready);
#   5. checks that /proc/<child>/stat names this shell as the parent;
#   6. prints pid:starttime:cmdlinehex (the command line's NUL-separated arguments, without the
#      final NUL, in lowercase hex).
# POSIX sh only: it runs under busybox ash and dash alike.
set -u
dir=$PLIMSOLL_INTERP_DIR
rm -rf "$dir" || exit 2
mkdir -p "${dir%/*}" || exit 2
mkdir -m 700 "$dir" || exit 2
mkfifo -m 600 "$dir/out" "$dir/err" || exit 2
mkdir -p "$PLIMSOLL_WORK" || exit 2
cd "$PLIMSOLL_WORK" || exit 2
setsid "$@" </dev/null 1<>"$dir/out" 2<>"$dir/err" &
child=$!

# Prints the fields of /proc/<pid>/stat after the command name (state first), or nothing.
stat_of() {
    line=
    read -r line <"/proc/$1/stat" 2>/dev/null || true
    [ -n "$line" ] && printf '%s\n' "${line##*) }"
}

tries=0
while :; do
    if [ -r "$dir/ready" ]; then
        got=
        read -r got <"$dir/ready" || true
        [ "$got" = "$child" ] && break
    fi
    fields=$(stat_of "$child")
    case "$fields" in
        "" | Z* | X*) exit 3 ;;
    esac
    tries=$((tries + 1))
    [ "$tries" -ge 400 ] && exit 4
    sleep 0.05
done

fields=$(stat_of "$child")
set -- $fields
# After the state: ppid is field 4 of stat, starttime field 22.
[ "${2:-}" = "$$" ] || exit 5
shift 19
start=$1
hex=$(od -An -v -tx1 "/proc/$child/cmdline" | tr -d ' \n')
hex=${hex%00}
[ -n "$hex" ] || exit 5
printf '%s:%s:%s\n' "$child" "$start" "$hex"
