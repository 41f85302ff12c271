#!/usr/bin/env bash
# The `alertmanager` image's entrypoint: arcvllm's routing (ALERTMANAGER_TEMPLATE) with the
# operator's webhook (ALERT_WEBHOOK_URL) written in, then Debian's Alertmanager with ARGS.
# Alertmanager 0.25 reads no environment in its configuration, so the URL goes into a copy
# in ALERTMANAGER_RUN_DIR (the data volume; mode 0600: a webhook URL often holds a token).
# Without a URL it refuses to start: an Alertmanager that notifies no one looks healthy.
set -euo pipefail

template=${ALERTMANAGER_TEMPLATE:-/etc/arcvllm/alertmanager/alertmanager.yml}
run_dir=${ALERTMANAGER_RUN_DIR:-/var/lib/prometheus/alertmanager}
url=${ALERT_WEBHOOK_URL:-}

if [[ -z $url ]]; then
    echo "alertmanager: ALERT_WEBHOOK_URL is not set: set it to the webhook that receives arcvllm's alerts (docs/scale.md)" >&2
    exit 3
fi
if [[ ! $url =~ ^https?://[^[:space:]\"\\]+$ ]]; then
    echo "alertmanager: ALERT_WEBHOOK_URL must be an http:// or https:// URL without spaces, quotes or backslashes" >&2
    exit 2
fi

config=$(<"$template")
umask 077
# The replacement is quoted: no & or \ of the URL is a pattern character (bash 5.2).
printf '%s\n' "${config//__ALERT_WEBHOOK_URL__/"$url"}" >"$run_dir/alertmanager.yml"
exec prometheus-alertmanager --config.file="$run_dir/alertmanager.yml" "$@"
