
for id in "$@"; do
  case $id in ''|*[!0-9]*) echo "refused $id (not a shmid)"; continue ;; esac
  if awk -v id="$id" '$2 == id && $7 == 0 { found = 1 } END { exit !found }' /proc/sysvipc/shm; then
    ipcrm -m "$id" && echo "removed $id"
  else
    echo "kept $id (attached again, or gone)"
  fi
done
