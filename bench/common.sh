# Shared by the bench scripts that time whole commands (sourced, after `cd` to the repository).

# run NAME COMMAND...: the command under /usr/bin/time -v, its output in $W/NAME.log (W: the
# script's work folder); prints its rate, wall time, peak memory, exit status and any error.
run() {
    local name=$1
    shift
    echo "== $name"
    /usr/bin/time -v "$@" > "$W/$name.log" 2>&1
    echo "exit $?" >> "$W/$name.log"
    grep -E "tokens/s|Elapsed|Maximum resident|^exit|rror" "$W/$name.log" | tail -5
}
