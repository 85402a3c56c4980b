# Sourced by the scripts that count instructions under callgrind in process
# (`decision_instructions.sh`, `layer_instructions.sh`, `guarantee_costs.sh`).

# Installs valgrind from Debian's packages when it is missing.
need_valgrind() {
    if ! command -v valgrind >/dev/null; then
        apt-get install -y valgrind >/dev/null
    fi
}

# Instructions per counted unit, to one decimal: the number of units, then the command. Only the
# instructions inside the command's functions named `measured` are counted.
counted() {
    local per=$1
    shift
    local out
    out=$(mktemp)
    valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect='*measured*' \
        "$@" >/dev/null 2>&1
    local total
    total=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    rm -f "$out"
    awk -v t="$total" -v n="$per" 'BEGIN { printf "%.1f", t / n }'
}
