#!/usr/bin/env bash
# Debian packages the deploy tests run for real: podman + runc (build and run the image,
# `podman kube play` the manifests), debootstrap (a stand-in for python:3.11-slim, which
# cannot be pulled here), prometheus (+ promtool: the dashboard queries, the alert rules'
# unit tests) and nginx-light (a random load balancer in front of proxy replicas,
# tests/e2e/test_scale_out.py). Installed only when missing, and only as root (CI runs as
# root); a machine where this cannot install them gets tests that fail naming the package.
set -uo pipefail

declare -A package=([podman]=podman [runc]=runc [debootstrap]=debootstrap
                    [prometheus]=prometheus [promtool]=prometheus [nginx]=nginx-light)
missing=()
for tool in "${!package[@]}"; do
    command -v "$tool" >/dev/null || missing+=("${package[$tool]}")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)

log() { echo "[deploy-tools] $*" >&2; }
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    log "not root or no apt-get: install ${missing[*]} yourself; the deploy tests fail without them"
    exit 0
fi
log "apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq "${missing[@]}" >/dev/null ||
    log "apt-get failed: the deploy tests will fail naming what is missing"
exit 0
