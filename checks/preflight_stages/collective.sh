# The collective: $1 the pinned venv's python, $2 seconds, $3 the script, then its arguments.
python=$1 seconds=$2 script=$3; shift 3
timeout -k 2 "$seconds" "$python" -I -c "$script" "$@"
