# The smoke job through one launcher's file: $1 seconds, then the launch command and its
# arguments. Started from / : DeepSpeed's runner starts every rank in the directory it was
# started in and puts that on PYTHONPATH, and / is root's alone. Prints the launcher's stdout
# (each rank's JSON line among its logs), then its exit status and its stderr's last lines.
seconds=$1; shift
( cd / && exec timeout -k 5 "$seconds" "$@" ) 2>"$TMPDIR/stderr"
printf '\nexit %s\n' "$?"  # on its own line, whatever the launcher printed last
tail -n 3 "$TMPDIR/stderr" | sed 's/^/stderr /'
