# shellcheck shell=bash
# gzip on the bench's three proxies, applied to a config already rendered from its
# template (stack.sh calls gzip_conf_edits after proxy_conf_edits); source, don't
# execute. Each proxy compresses HTML it got uncompressed from the backends, with
# gzip at one level for all three, for clients that accept gzip (W5):
#
#   BENCH_GZIP [0]        1: gzip on every proxy (the gateway's `[compression]`,
#                         nginx's `gzip`, HAProxy's `compression`); 0: each as its
#                         template has it (the gateway's compression is on by default,
#                         so W1-W4, which accept only identity, pay its skip)
#   BENCH_GZIP_LEVEL [1]  the level: nginx's `gzip_comp_level` and HAProxy's
#                         `tune.comp.maxlevel` default to 1; the gateway's `level`
#                         defaults to 5 (the book says why)

BENCH_GZIP=${BENCH_GZIP:-0}
BENCH_GZIP_LEVEL=${BENCH_GZIP_LEVEL:-1}

# gzip_conf_edits PROXY FILE: BENCH_GZIP applied to the rendered config FILE of PROXY
gzip_conf_edits() {
    local proxy=$1 file=$2
    case $proxy in
    gateway)
        [ "$BENCH_GZIP" = 1 ] && printf '\n[compression]\nlevel = %s\n' "$BENCH_GZIP_LEVEL" >>"$file"
        ;;
    nginx)
        [ "$BENCH_GZIP" = 1 ] && sed -i -e "/^    server_tokens off;/a\\
    gzip on; gzip_proxied any; gzip_comp_level $BENCH_GZIP_LEVEL; gzip_min_length 1024; gzip_types text/css application/javascript application/json image/svg+xml;" "$file"
        ;;
    haproxy)
        [ "$BENCH_GZIP" = 1 ] && sed -i -e "/^global/a\\
    tune.comp.maxlevel $BENCH_GZIP_LEVEL" -e "/^backend be_web/a\\
    compression algo gzip\\
    compression type text/html text/css application/javascript application/json image/svg+xml" "$file"
        ;;
    esac
    return 0
}
