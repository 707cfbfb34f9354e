#!/usr/bin/env bash
# A throwaway certificate authority and the certificates a local secure Kafka needs.
#
#   ops/kafka/certs.sh DIR     make what is missing in DIR (nothing if DIR/ca.pem exists)
#
# DIR gets:
#   ca.pem, ca.key                the CA (valid 30 days; delete DIR to get a new one)
#   broker-keystore.pem           the broker's private key and certificate chain, PEM, as
#                                 Kafka's `ssl.keystore.type=PEM` reads it (the key is PKCS#8)
#   broker.pem                    the broker's certificate alone: SAN IP:127.0.0.1, DNS:localhost
#   client.pem, client.key        a client certificate (CN=app) for the mTLS listener
#
# Nothing here is a secret worth keeping: the keys are unencrypted and the CA signs only
# these two certificates. Never use it for anything but a broker on 127.0.0.1.
set -euo pipefail

DIR="${1:?usage: $0 DIR}"
DAYS="${CERT_DAYS:-30}"
command -v openssl >/dev/null || { echo "certs: openssl is needed" >&2; exit 1; }

if [ -f "$DIR/ca.pem" ] && [ -f "$DIR/broker-keystore.pem" ] && [ -f "$DIR/client.pem" ]; then
  exit 0
fi
mkdir -p "$DIR"
cd "$DIR"
rm -f ca.* broker* client* ./*.csr ./*.ext ./*.srl

quiet() { "$@" >/dev/null 2>&1 || { echo "certs: failed: $*" >&2; "$@" >&2; exit 1; }; }

quiet openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$DAYS" \
  -keyout ca.key -out ca.pem -subj "/CN=order-event-processor throwaway CA $(date +%s)-$$" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

issue() {  # issue NAME SUBJECT EXTENSIONS
  quiet openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$1.key" -out "$1.csr" -subj "$2"
  printf '%b\n' "$3" >"$1.ext"
  quiet openssl x509 -req -sha256 -days "$DAYS" -in "$1.csr" -CA ca.pem -CAkey ca.key \
    -set_serial "0x$(openssl rand -hex 16)" -extfile "$1.ext" -out "$1.pem"
  rm -f "$1.csr" "$1.ext"
}

issue broker "/CN=localhost" \
  "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost"
issue client "/CN=app" \
  "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth"

# openssl 3 writes unencrypted keys as PKCS#8 ("BEGIN PRIVATE KEY"), the only form Kafka's
# PEM keystore reads.
cat broker.key broker.pem ca.pem >broker-keystore.pem
rm -f broker.key
chmod 600 ./*.key broker-keystore.pem
