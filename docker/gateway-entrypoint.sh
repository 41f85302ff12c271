#!/usr/bin/env bash
# The gateway image's entrypoint: checks the settings, fills deploy/gateway's nginx.conf
# template into GATEWAY_RUN_DIR and runs nginx in the foreground.
#   gateway-entrypoint.sh                 render, then exec nginx
#   gateway-entrypoint.sh --render-only   render and print the folder (tests, debugging)
# A missing or malformed file is one line and exit 3; a bad value one line and exit 2.
# The key is read from VLLM_API_KEY_FILE into a file only this user reads; it is never an
# argument of any process.
set -euo pipefail

TEMPLATE=${GATEWAY_TEMPLATE:-/etc/arcvllm/gateway/nginx.conf.template}
RUN_DIR=${GATEWAY_RUN_DIR:-${TMPDIR:-/tmp}/arcvllm-gateway}
TLS_DIR=${GATEWAY_TLS_DIR:-/var/lib/arcvllm-gateway/tls}
UPSTREAM=${GATEWAY_UPSTREAM:-http://vllm:8000}
PORT=${GATEWAY_PORT:-8443}
RATE=${GATEWAY_RATE:-10r/s}
BURST=${GATEWAY_BURST:-20}
CONN_PER_CLIENT=${GATEWAY_CONN_PER_CLIENT:-256}
MAX_BODY=${GATEWAY_MAX_BODY:-4m}
READ_TIMEOUT=${GATEWAY_READ_TIMEOUT:-3600s}
SERVER_NAME=${GATEWAY_SERVER_NAME:-localhost}
DIAGNOSTIC=${GATEWAY_DIAGNOSTIC_ROUTES:-0}
umask 077 # every file written here (key map, config, self-signed key): this user only

die() { # die CODE MESSAGE
	echo "gateway: $2" >&2
	exit "$1"
}

check() { # check SETTING VALUE REGEX EXAMPLE
	[[ $2 =~ $3 ]] || die 2 "$1=$2 is not valid (e.g. $4)"
}

check GATEWAY_UPSTREAM "$UPSTREAM" '^https?://[A-Za-z0-9.-]+(:[0-9]+)?$' http://vllm:8000
check GATEWAY_PORT "$PORT" '^[0-9]+$' 8443
check GATEWAY_RATE "$RATE" '^[1-9][0-9]*r/[sm]$' 10r/s
check GATEWAY_BURST "$BURST" '^[0-9]+$' 20
check GATEWAY_CONN_PER_CLIENT "$CONN_PER_CLIENT" '^[1-9][0-9]{0,3}$' 256
check GATEWAY_MAX_BODY "$MAX_BODY" '^[1-9][0-9]*[kKmM]?$' 4m
check GATEWAY_READ_TIMEOUT "$READ_TIMEOUT" '^[1-9][0-9]*[smh]?$' 3600s
# The names clients dial, comma-separated: DNS names and IPv4/IPv6 addresses. Each is a name
# of the self-signed certificate, an address as an IP name (a client checks an address it
# dialled against IP names only), besides localhost and 127.0.0.1.
san_of() { # san_of NAME: DNS:NAME or IP:NAME, or nothing when NAME is neither
	local name=$1 label='[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?' octet
	if [[ $name =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
		for octet in ${name//./ }; do ((10#$octet <= 255)) || return 0; done
		echo "IP:$name"
	elif [[ $name == *:*:* && $name =~ ^[0-9A-Fa-f:.]+$ ]]; then
		echo "IP:$name"
	elif [[ $name =~ ^$label(\.$label)*$ && ${#name} -le 253 ]]; then
		echo "DNS:$name"
	fi
}
sans=()
IFS=, read -ra server_names <<<"$SERVER_NAME,"
# `gateway`: the name the canary beside it dials (compose's service name)
for name in "${server_names[@]}" localhost 127.0.0.1 gateway; do
	san=$(san_of "$name")
	[[ -n $san ]] || die 2 "GATEWAY_SERVER_NAME=$SERVER_NAME is not valid: ${name:-an empty name} is neither a DNS name nor an IP address (e.g. api.example.org,192.0.2.10)"
	[[ " ${sans[*]} " == *" $san "* ]] || sans+=("$san")
done
subject_alt_names=$(IFS=,; echo "${sans[*]}")
check GATEWAY_DIAGNOSTIC_ROUTES "$DIAGNOSTIC" '^[01]$' 0
# The relay's socket to the https server lives there: a socket path holds at most 107 bytes
# (checked when nginx is to start; a rendering alone makes no socket).
[[ ${1-} == --render-only ]] || ((${#RUN_DIR} <= 96)) ||
	die 2 "GATEWAY_RUN_DIR=$RUN_DIR is longer than 96 characters (its socket's path would not fit)"

# ---- the key
[[ -n ${VLLM_API_KEY_FILE-} ]] || die 3 "VLLM_API_KEY_FILE is not set: the file holding the API key (compose: the api-key secret)"
[[ -f $VLLM_API_KEY_FILE && -r $VLLM_API_KEY_FILE ]] ||
	die 3 "VLLM_API_KEY_FILE=$VLLM_API_KEY_FILE is not a readable file"
# The key rule, the same in docker/entrypoint.sh and arcvllm (options.read_key), with the same
# words: one line (its newline optional) of 1 to 256 of RFC 6750's token characters, none
# of which nginx's configuration syntax or a regular expression between \Q and \E reads
# differently. `read -d ''` stops at a NUL byte (status 0) or at the end (status 1).
KEY_RULE="the key file must be one line of 1 to 256 of the characters A-Z a-z 0-9 . _ ~ + / = - (make one: openssl rand -hex 32)"
if IFS= read -r -d '' key <"$VLLM_API_KEY_FILE"; then key=$'\n\n'; fi # a NUL byte: refused
key=${key%$'\n'}
key_chars=ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~+/=- # not A-Z: locales
[[ $key =~ ^[$key_chars]{1,256}$ ]] || die 3 "VLLM_API_KEY_FILE=$VLLM_API_KEY_FILE: $KEY_RULE"

# ---- the resolver: the container's DNS server (Docker's 127.0.0.11, a cluster's DNS)
resolver=${GATEWAY_RESOLVER:-$(awk '$1 == "nameserver" {print $2; exit}' /etc/resolv.conf 2>/dev/null || true)}
[[ -n $resolver ]] || die 3 "no nameserver in /etc/resolv.conf: set GATEWAY_RESOLVER"
[[ $resolver == *:* && $resolver != \[* ]] && resolver="[$resolver]" # IPv6

# ---- TLS: the operator's certificate, else a self-signed one kept in GATEWAY_TLS_DIR
given() { # a non-empty file; unset or an empty file (compose's default) is "not given"
	[[ -n ${!1-} ]] || return 1
	[[ -e ${!1} ]] || die 3 "$1=${!1}: no such file"
	[[ ! -d ${!1} ]] || die 3 "$1=${!1} is a directory, not a PEM file"
	[[ -s ${!1} ]] || return 1
	[[ -r ${!1} ]] || die 3 "$1=${!1} is not readable by this user (UID $(id -u))"
}
if given GATEWAY_TLS_CERT; then
	given GATEWAY_TLS_KEY || die 2 "GATEWAY_TLS_CERT is given but GATEWAY_TLS_KEY is not: give both"
	cert=$GATEWAY_TLS_CERT cert_key=$GATEWAY_TLS_KEY
	echo "gateway: TLS with the given certificate $(openssl x509 -in "$cert" -noout -subject -enddate | tr '\n' ' ')"
elif given GATEWAY_TLS_KEY; then
	die 2 "GATEWAY_TLS_KEY is given but GATEWAY_TLS_CERT is not: give both"
else
	# names: the subjectAltName the kept certificate was made for; another (or none, from
	# an older start) makes it anew, so a changed GATEWAY_SERVER_NAME takes effect.
	cert=$TLS_DIR/cert.pem cert_key=$TLS_DIR/key.pem names=$TLS_DIR/names
	made="kept from an earlier start"
	kept_names=$(cat "$names" 2>/dev/null || true)
	if [[ ! -s $cert || ! -s $cert_key || $kept_names != "$subject_alt_names" ]]; then
		made="made now"
		[[ -s $cert && -s $cert_key ]] && made="made now (its names changed: $subject_alt_names)"
		mkdir -p "$TLS_DIR" 2>/dev/null || die 3 "GATEWAY_TLS_DIR=$TLS_DIR cannot be created by UID $(id -u)"
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
			-days 825 -subj "/CN=${server_names[0]}" \
			-addext "subjectAltName=$subject_alt_names" \
			-keyout "$cert_key" -out "$cert" 2>/dev/null ||
			die 3 "cannot write a self-signed certificate to GATEWAY_TLS_DIR=$TLS_DIR"
		echo "$subject_alt_names" >"$names"
	fi
	echo "gateway: no certificate given (GATEWAY_TLS_CERT, GATEWAY_TLS_KEY): self-signed for $SERVER_NAME, $made in $TLS_DIR, $(openssl x509 -in "$cert" -noout -fingerprint -sha256)"
fi

# ---- render
[[ -r $TEMPLATE ]] || die 3 "GATEWAY_TEMPLATE=$TEMPLATE is not a readable file"
mkdir -p "$RUN_DIR" 2>/dev/null || die 3 "GATEWAY_RUN_DIR=$RUN_DIR cannot be created by UID $(id -u)"
# printf is a shell builtin: the key is in no process's arguments. `~`: a case-sensitive
# regular expression, the key quoted between \Q and \E.
printf '"~^Bearer \\Q%s\\E$" 1;\n' "$key" >"$RUN_DIR/key.map"
unset key
rm -f "$RUN_DIR/https.sock" # a previous start's (the relay's socket to the https server)
if [[ $DIAGNOSTIC == 1 ]]; then
	cat >"$RUN_DIR/diagnostic-routes.conf" <<-'EOF'
		location = /tokenize {
		    auth_request /_key;
		    proxy_pass $upstream/tokenize;
		}
		location = /metrics {
		    auth_request /_key;
		    proxy_pass $upstream/metrics;
		}
	EOF
	echo "gateway: GATEWAY_DIAGNOSTIC_ROUTES=1: /tokenize and /metrics are served too (with the key)"
else
	: >"$RUN_DIR/diagnostic-routes.conf"
fi
sed -e "s|@RUN_DIR@|$RUN_DIR|g" -e "s|@UPSTREAM@|$UPSTREAM|g" -e "s|@PORT@|$PORT|g" \
	-e "s|@RATE@|$RATE|g" -e "s|@BURST@|$BURST|g" -e "s|@MAX_BODY@|$MAX_BODY|g" \
	-e "s|@CONN_PER_CLIENT@|$CONN_PER_CLIENT|g" \
	-e "s|@READ_TIMEOUT@|$READ_TIMEOUT|g" -e "s|@RESOLVER@|$resolver|g" \
	-e "s|@CERT@|$cert|g" -e "s|@CERT_KEY@|$cert_key|g" "$TEMPLATE" >"$RUN_DIR/nginx.conf"
echo "gateway: https port $PORT -> $UPSTREAM; per client: rate $RATE (burst $BURST), $CONN_PER_CLIENT connections; body up to $MAX_BODY"

if [[ ${1-} == --render-only ]]; then
	echo "$RUN_DIR"
	exit 0
fi
exec nginx -e stderr -c "$RUN_DIR/nginx.conf" -g 'daemon off;'
