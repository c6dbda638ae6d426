
root_safe_dir() {
  p=$(readlink -m -- "$1"); first=1
  while :; do
    if [ -e "$p" ]; then
      set -- $(stat -c '%u %a' -- "$p")
      [ "$1" = 0 ] || fail "$p is not owned by root: root does not write where another user can"
      if [ $(( 0$2 & 022 )) -ne 0 ]; then
        if [ $first = 1 ] || [ $(( 0$2 & 01000 )) -eq 0 ]; then fail "$p is writable by others: root does not write there"; fi
      fi
      first=0
    fi
    [ "$p" = / ] && break
    p=${p%/*}; [ -n "$p" ] || p=/
  done
}
