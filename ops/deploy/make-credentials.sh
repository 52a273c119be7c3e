#!/bin/sh
# Make a new cluster's credentials for the deploy kit (docs/deployment.md, "Security"):
#
#   ops/deploy/make-credentials.sh OUT HOST[,SAN...] [HOST[,SAN...]...]
#   e.g. ops/deploy/make-credentials.sh ./credentials h1,10.0.0.1 h2,10.0.0.2 h3,10.0.0.3
#
# OUT (mode 0700, every file 0600):
#   secret          signs every token (the bookies' and the proxies' auth_secret_file)
#   grants.toml     who may do what; the principal admin is a superuser
#   ledger.secret   every ledger's key derives from it: back it up, losing it loses data
#   zk.digest       ZooKeeper digest credentials (user:password): every znode admits
#                   this user alone
#   service.env     BOOKLINE_TOKEN=... autorecovery's token for the bookies, valid a
#                   year: re-issue it before then (the proxies sign their own)
#   admin.token     an admin token for you (a day; mint more with `bookline auth token`)
#   tls/ca.pem      the CA every process trusts (no secret: give it to clients)
#   tls/ca-key.pem  the CA's key: keep it offline, it is needed only to issue more
#   tls/HOST/       per host: node.pem (SANs HOST and each SAN), node-key.pem, and
#                   zk-keystore.pem (the key, then the certificate: ZooKeeper's PEM
#                   key store)
#   bookies/ID.identity  bookie ID's credential ([bookie] identity_file): it proves to
#                   the clients that the bookie belongs to the cluster (docs/security.md,
#                   "Bookie identity"); one per bookie of $BOOKIES
# On each host put OUT's files, with tls/HOST/* as tls/* and only the host's own
# bookies' bookies/ID.identity, into /etc/bookline/credentials/ (owner bookline,
# 0700); ZooKeeper's zk-keystore.pem and ca.pem into /etc/zookeeper/tls/ (owner
# zookeeper). Never copy ca-key.pem to a host.
# $BOOKLINE names the bookline command (default: bookline on the PATH): the tokens and
# the bookies' credentials are Bookline's own (`bookline auth token`, `bookline auth
# bookie-credential`), so run this where Bookline is installed.
# $BOOKIES names the bookies (default: the kit's, bookie-1 .. bookie-4 of ops/deploy/env).
set -eu
umask 077

if [ $# -lt 2 ]; then
    echo "usage: $0 OUT HOST[,SAN...] [HOST[,SAN...]...]" >&2
    exit 2
fi
out=$1
shift
if [ -e "$out/secret" ]; then
    echo "$out/secret exists: refusing to replace a cluster's credentials" >&2
    exit 1
fi
bookline=${BOOKLINE:-bookline}
bookies=${BOOKIES:-bookie-1 bookie-2 bookie-3 bookie-4}
days=825  # certificates: renew before (docs/deployment.md, "Rotating")

mkdir -p "$out/tls"
chmod 700 "$out"
openssl rand -hex 32 > "$out/secret"
openssl rand -hex 32 > "$out/ledger.secret"
printf 'bookline:%s\n' "$(openssl rand -hex 24)" > "$out/zk.digest"
printf 'superusers = ["admin"]\n' > "$out/grants.toml"
token=$($bookline auth token --secret-file "$out/secret" --principal bookline-service \
    --expires-in 31536000)
printf 'BOOKLINE_TOKEN=%s\n' "$token" > "$out/service.env"
$bookline auth token --secret-file "$out/secret" --principal admin > "$out/admin.token"
mkdir -p "$out/bookies"
for id in $bookies; do
    $bookline auth bookie-credential "$id" --ledger-secret-file "$out/ledger.secret" \
        --out "$out/bookies/$id.identity" > /dev/null
done

key() {
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
}

key "$out/tls/ca-key.pem"
openssl req -x509 -new -key "$out/tls/ca-key.pem" -out "$out/tls/ca.pem" -days "$days" \
    -subj "/CN=Bookline CA" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign"

for spec in "$@"; do
    host=${spec%%,*}
    dir="$out/tls/$host"
    mkdir -p "$dir"
    sans=""
    for name in $(printf '%s' "$spec" | tr ',' ' '); do
        case $name in
            *[!0-9.]*) kind=DNS ;;  # anything but digits and dots: a name
            *) kind=IP ;;
        esac
        sans="${sans:+$sans,}$kind:$name"
    done
    key "$dir/node-key.pem"
    openssl req -new -key "$dir/node-key.pem" -out "$dir/node.csr" -subj "/CN=$host"
    printf '%s\n' "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature,keyEncipherment" \
        "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$sans" > "$dir/node.ext"
    openssl x509 -req -in "$dir/node.csr" -CA "$out/tls/ca.pem" -CAkey "$out/tls/ca-key.pem" \
        -CAcreateserial -out "$dir/node.pem" -days "$days" -extfile "$dir/node.ext" 2>/dev/null
    cat "$dir/node-key.pem" "$dir/node.pem" > "$dir/zk-keystore.pem"
    rm "$dir/node.csr" "$dir/node.ext"
done
rm -f "$out/tls/ca.srl"
echo "credentials in $out (copy them as its header says)"
