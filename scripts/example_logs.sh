#!/usr/bin/env bash
# Writes the example access logs the guide's `tollgate replay` commands read (src/guide/cli.md):
# examples/replay/access.log (nginx/Apache `combined`) and examples/replay/access.jsonl (JSON
# lines, the same requests), two minutes of one API's traffic on 14 Nov 2023 from 22:00 UTC:
#
# - eight ordinary clients (198.51.100.1-8, API keys app-1 to app-8), a call every 6 s each;
# - a batch job (198.51.100.200, key batch) at 7 calls a second for the first 20 s;
# - a scraper without a key (203.0.113.50) at 15 calls a second from 0:40 to 0:50;
# - an address guessing passwords (192.0.2.66): a failed POST /login every 3 s.
#
# Arithmetic only, no random numbers: every awk writes the same files, which are committed.
set -euo pipefail
cd "$(dirname "$0")/.."

awk -v combined=examples/replay/access.log -v jsonl=examples/replay/access.jsonl '
function emit(s, ip, key, method, path, status, bytes, agent,    clock) {
    clock = sprintf("22:%02d:%02d", int(s / 60), s % 60)
    printf "%s - - [14/Nov/2023:%s +0000] \"%s %s HTTP/1.1\" %d %d \"-\" \"%s\"\n",
        ip, clock, method, path, status, bytes, agent > combined
    printf "{\"ts\":\"2023-11-14T%sZ\",\"remote_addr\":\"%s\",", clock, ip > jsonl
    if (key != "")
        printf "\"api_key\":\"%s\",", key > jsonl
    printf "\"method\":\"%s\",\"path\":\"%s\",\"status\":%d}\n", method, path, status > jsonl
}
BEGIN {
    for (s = 0; s < 120; s++) {
        for (c = 1; c <= 8; c++)
            if ((s + c) % 6 == 0)
                emit(s, "198.51.100." c, "app-" c, "GET", "/v1/items/" (s * 7 + c) % 100, 200, 512, "app/2.1")
        if (s < 20)
            for (i = 0; i < 7; i++)
                emit(s, "198.51.100.200", "batch", "GET", "/v1/search?page=" (s * 7 + i), 200, 900, "batch/1.0")
        if (s >= 40 && s < 50)
            for (i = 0; i < 15; i++)
                emit(s, "203.0.113.50", "", "GET", "/v1/items/" (s * 15 + i) % 100, 200, 512, "python-requests/2.31")
        if (s % 3 == 0)
            emit(s, "192.0.2.66", "", "POST", "/login", 401, 32, "curl/8.4")
    }
}'
wc -l examples/replay/access.log examples/replay/access.jsonl
