
for f in "$@"; do tf_file "$f" "$f"; done
