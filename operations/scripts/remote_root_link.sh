
only_roots="root follows a link only through root's own files and directories"
root_only() {
  set -- $(stat -c '%u %a' -- "$1") "$1"
  [ "$1" = 0 ] && [ $(( 0$2 & 022 )) -eq 0 ] && return 0
  fail "is a symbolic link through $3, which is not root's alone: $only_roots"
}
root_link() {
  rest=$1; cur=; n=0
  root_only /
  while [ -n "$rest" ]; do
    case $rest in /*) rest=${rest#/}; continue ;; esac
    c=${rest%%/*}; case $rest in */*) rest=${rest#*/} ;; *) rest= ;; esac
    case $c in .) continue ;; ..) cur=${cur%/*}; continue ;; esac
    p=$cur/$c
    if [ -L "$p" ]; then
      n=$((n + 1)); [ $n -le 40 ] || fail "has too many levels of symbolic links"
      [ "$(stat -c %u -- "$p")" = 0 ] || fail "is a symbolic link through $p, a link not owned by root: $only_roots"
      t=$(readlink -- "$p"); case $t in /*) cur= ;; esac
      rest=$t${rest:+/$rest}
    elif [ -e "$p" ]; then root_only "$p"; cur=$p
    elif [ -n "$rest" ]; then fail "is a dangling symbolic link"
    else cur=$p
    fi
  done
  printf '%s\n' "$cur"
}
