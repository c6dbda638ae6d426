# The collective: $1 the pinned venv's python, $2 seconds, $3 the script, then its arguments.
# A python that is missing or cannot start prints no step of its own: this script says so
# (`nopython`, then its exit status and the last lines it wrote to stderr), never a silence
# the controller could only call a timeout.
python=$1 seconds=$2 script=$3; shift 3
if [ ! -x "$python" ]; then echo "nopython"; exit 2; fi
timeout -k 2 "$seconds" "$python" -I -c "$script" "$@" 2>stderr
rc=$?
if [ "$rc" != 0 ]; then printf '\nexit %s\n' "$rc"; tail -n 3 stderr | sed 's/^/stderr /'; fi
exit "$rc"
