# shellcheck shell=bash
# TLS and the keep-alive idle timeout for the bench's three proxies, applied to a
# config already rendered from its template. Sourced by stack.sh (which calls
# proxy_conf_edits after each render); source, don't execute.
#
# Every proxy terminates TLS with one self-signed ECDSA P-256 certificate and each
# proxy's TLS defaults otherwise, with one exception: nginx before 1.23.4 offers only
# TLS 1.2 by default, so it gets `ssl_protocols TLSv1.2 TLSv1.3` (newer nginx's
# default) and all three speak TLS 1.3 to a client that offers it. Session tickets
# and caches stay as each proxy ships them: nginx and HAProxy resume by ticket out
# of the box, the gateway too (`[tls]` has no key for it).
#
#   BENCH_TLS [0]            1: TLS on every proxy's public port
#   BENCH_ALPN [h2,http/1.1] the protocols each proxy offers by ALPN (nginx: `http2`
#                            on its listen line when h2 is named; the gateway always
#                            offers both: ALPN only chooses)
#   BENCH_KEEPALIVE          seconds an idle client connection is kept, set the same
#                            on all three (gateway `[timeouts] keep_alive`, nginx
#                            `keepalive_timeout`, HAProxy `timeout http-keep-alive`
#                            and `timeout client`); unset: each template's own
#   GATEWAY_TIMEOUTS         further lines for the gateway's [timeouts] (with
#                            BENCH_KEEPALIVE), e.g. 'upstream_idle = "300s"'

BENCH_TLS=${BENCH_TLS:-0}
BENCH_ALPN=${BENCH_ALPN:-h2,http/1.1}

# tls_cert: the run's certificate, made once under $WORK/tls; sets TLS_CERT, TLS_KEY
# and TLS_PEM (both in one file, as HAProxy reads them)
tls_cert() {
    TLS_CERT=$WORK/tls/cert.pem TLS_KEY=$WORK/tls/key.pem TLS_PEM=$WORK/tls/haproxy.pem
    [ -s "$TLS_PEM" ] && return 0
    command -v openssl >/dev/null 2>&1 || die "missing tool: openssl (apt-get install openssl)"
    mkdir -p "$WORK/tls"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj /CN=localhost -keyout "$TLS_KEY" -out "$TLS_CERT" 2>/dev/null \
        || die "openssl could not make a certificate"
    cat "$TLS_CERT" "$TLS_KEY" >"$TLS_PEM"
}

# proxy_conf_edits PROXY FILE PORT: BENCH_TLS and BENCH_KEEPALIVE applied to the
# rendered config FILE of PROXY (gateway, nginx, haproxy) listening on PORT
proxy_conf_edits() {
    local proxy=$1 file=$2 port=$3 ka=${BENCH_KEEPALIVE:-} nginx_listen
    case $proxy in
    gateway)
        [ -n "$ka" ] && printf '\n[timeouts]\nkeep_alive = "%ss"\n%s\n' "$ka" "${GATEWAY_TIMEOUTS:-}" >>"$file"
        if [ "$BENCH_TLS" = 1 ]; then
            tls_cert
            printf '\n[tls]\ncert = "%s"\nkey = "%s"\n' "$TLS_CERT" "$TLS_KEY" >>"$file"
        fi
        ;;
    nginx)
        [ -n "$ka" ] && sed -i -e "/^    keepalive_timeout /s/ [0-9]*s;/ ${ka}s;/" "$file"
        if [ "$BENCH_TLS" = 1 ]; then
            tls_cert
            nginx_listen="listen 127.0.0.1:$port ssl"
            [[ ",$BENCH_ALPN," == *,h2,* ]] && nginx_listen+=" http2"
            sed -i -e "s|listen 127.0.0.1:$port backlog=4096;|$nginx_listen backlog=4096;\n        ssl_certificate $TLS_CERT;\n        ssl_certificate_key $TLS_KEY;\n        ssl_protocols TLSv1.2 TLSv1.3;|" "$file"
        fi
        ;;
    haproxy)
        [ -n "$ka" ] && sed -i -e "s/timeout client [0-9]*s/timeout client ${ka}s/; s/timeout http-keep-alive [0-9]*s/timeout http-keep-alive ${ka}s/" "$file"
        if [ "$BENCH_TLS" = 1 ]; then
            tls_cert
            sed -i -e "s|bind 127.0.0.1:$port\$|bind 127.0.0.1:$port ssl crt $TLS_PEM alpn $BENCH_ALPN|" "$file"
        fi
        ;;
    esac
}

# proxy_url PROXY: the URL a client reaches PROXY at
proxy_url() {
    if [ "$BENCH_TLS" = 1 ]; then echo "https://127.0.0.1:${PROXY_PORT[$1]}"; else echo "http://127.0.0.1:${PROXY_PORT[$1]}"; fi
}
