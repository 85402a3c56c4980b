#!/usr/bin/env bash
# Renders the `tollgate replay --report` page of a demo log in headless Chromium and saves a
# screenshot as docs/replay-report.png (the guide's chapter on the command, src/guide/cli.md, names it).
#
# The demo log is made here, deterministically: ten minutes of `combined` lines from 60 ordinary
# clients, a batch job at a steady 7 per second, one scraper that speeds up, and one address
# guessing passwords on POST /login. It is
# replayed through cli/tests/data/api.toml compared with cli/tests/data/strict.toml.
#
# Chromium comes from Debian's `chromium` package, installed when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium
fi

work="target/replay-demo"
rm -rf "$work"
mkdir -p "$work"
awk 'BEGIN {
    srand(17)
    for (s = 0; s < 600; s++) {
        stamp = sprintf("14/Nov/2023:22:%02d:%02d +0000", int(s / 60), s % 60)
        for (c = 0; c < 60; c++)
            if (rand() < 0.15)
                printf "198.51.100.%d - - [%s] \"GET /v1/items/%d HTTP/1.1\" 200 512 \"-\" \"app/2.1\"\n", c, stamp, int(rand() * 100)
        scraper = (s < 200) ? 4 : (s < 400 ? 9 : 16)
        for (i = 0; i < scraper; i++)
            printf "203.0.113.50 - - [%s] \"GET /v1/items/%d HTTP/1.1\" 200 512 \"-\" \"python-requests/2.31\"\n", stamp, s * 20 + i
        for (i = 0; i < 7; i++)
            printf "198.51.100.200 - - [%s] \"GET /v1/search HTTP/1.1\" 200 900 \"-\" \"batch/1.0\"\n", stamp
        if (s % 3 == 0)
            printf "192.0.2.66 - - [%s] \"POST /login HTTP/1.1\" 401 32 \"-\" \"curl/8.4\"\n", stamp
        if (s % 45 == 0)
            printf "198.51.100.%d - - [%s] \"POST /login HTTP/1.1\" 200 64 \"-\" \"app/2.1\"\n", s % 60, stamp
    }
}' >"$work/access.log"

cargo run --release -q -p tollgate-cli -- replay \
    --config cli/tests/data/api.toml --compare cli/tests/data/strict.toml \
    --log "$work/access.log" --report "$work/report"

mkdir -p docs
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=820,1500 \
    --screenshot="$PWD/docs/replay-report.png" "file://$PWD/$work/report/index.html" 2>/dev/null
ls -l docs/replay-report.png
