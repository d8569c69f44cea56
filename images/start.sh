# plimsoll's start script (providers.md §5.5). plimsolld embeds this file and runs it in every
# docker guest as
#
#   /usr/bin/env -i PATH=<fixed> /bin/sh -c <this script> sh <marker> [NAME=value…] <argv…>
#
# so neither the image's ENTRYPOINT, CMD nor ENV ever drives a plimsoll process. It:
#   1. writes the per-run marker and a newline to stderr: the daemon's proof that docker started
#      the command (no marker means docker failed, whatever the exit code says);
#   2. reads its own uid from /proc/self/status;
#   3. sets HOME to that uid's passwd home, or / when there is none (the usual case: the guest
#      uid has no passwd entry);
#   4. sets HOSTNAME from /etc/hostname;
#   5. execs `env -i` with the fixed PATH, HOME and HOSTNAME, then the explicit NAME=value list
#      (the image's verified ENV, then run variables), then the command. `env` takes every
#      leading NAME=value argument as a variable and the first other one as the command.
# POSIX sh only: it runs under busybox ash and dash alike.
marker=$1
shift
printf '%s\n' "$marker" >&2
uid=
while read -r key value rest; do
    if [ "$key" = "Uid:" ]; then
        uid=$value
        break
    fi
done </proc/self/status
home=/
if [ -n "$uid" ] && [ -r /etc/passwd ]; then
    while IFS=: read -r _name _pw entry_uid _gid _gecos entry_home _shell; do
        if [ "$entry_uid" = "$uid" ]; then
            home=${entry_home:-/}
            break
        fi
    done </etc/passwd
fi
host=
if [ -r /etc/hostname ]; then
    read -r host </etc/hostname || true
fi
exec /usr/bin/env -i "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    "HOME=$home" "HOSTNAME=$host" "$@"
