#!/usr/bin/env bash
# Installs Debian's headless Chromium for the report's browser tests (no browser download).
#
# Also fixes Debian's launcher snippet /etc/chromium.d/dev-shm: it reads the free space of
# /dev/shm with `findmnt -T /dev/shm`, which prints one line per mount, and a container often
# has /dev/shm mounted twice; the snippet's `[ $shm_avail -lt ... ]` then prints
# "[: ...: unexpected operator" on every launch. Keeping the first line fixes it (idempotent).
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi

fix_dev_shm_snippet() {
    local f=/etc/chromium.d/dev-shm
    [ -f "$f" ] || return 0
    if grep -q 'findmnt -bnr -o avail -T /dev/shm)' "$f"; then
        $SUDO sed -i 's|findmnt -bnr -o avail -T /dev/shm)|findmnt -bnr -o avail -T /dev/shm \| head -n1)|' "$f"
    fi
}

if ! command -v chromium >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
fix_dev_shm_snippet
