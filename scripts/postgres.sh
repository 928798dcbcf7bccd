#!/usr/bin/env bash
# Make a local PostgreSQL server available for the store's tests (Debian, run as root).
#
# Idempotent: installs the server if missing, creates and starts the cluster, listens on
# 127.0.0.1 only, creates role ddlsim and database ddlsim_test. Progress goes to stderr; the
# one line on stdout is for eval:
#   eval "$(sudo bash scripts/postgres.sh)"   # sets DDLSIM_TEST_POSTGRES_URL
set -euo pipefail

ROLE=ddlsim
PASSWORD=ddlsim
DATABASE=ddlsim_test
CLUSTER=main
HOST=127.0.0.1

say() { echo "postgres.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (it installs and starts the server); got uid $(id -u)"

if ! command -v pg_ctlcluster >/dev/null || ! compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null; then
    command -v apt-get >/dev/null || die "PostgreSQL is not installed and apt-get is missing"
    say "installing postgresql with apt-get"
    apt-get update -qq >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2 \
        || die "apt-get install postgresql failed"
fi

VERSION=$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n 1)
[[ -n $VERSION && -x /usr/lib/postgresql/$VERSION/bin/postgres ]] \
    || die "no server binaries under /usr/lib/postgresql"

if ! pg_lsclusters -h | awk -v v="$VERSION" -v c="$CLUSTER" '$1 == v && $2 == c {found = 1} END {exit !found}'; then
    say "creating cluster $VERSION/$CLUSTER"
    pg_createcluster "$VERSION" "$CLUSTER" >&2 || die "pg_createcluster $VERSION $CLUSTER failed"
fi

PORT=$(pg_conftool -s "$VERSION" "$CLUSTER" show port 2>/dev/null || echo 5432)
status() { pg_lsclusters -h | awk -v v="$VERSION" -v c="$CLUSTER" '$1 == v && $2 == c {print $4}'; }

# A conf.d drop-in (read after postgresql.conf) rather than an edit of the packaged file.
CONF_DIR=/etc/postgresql/$VERSION/$CLUSTER/conf.d
WANTED="listen_addresses = '$HOST'  # scripts/postgres.sh: tests only, no outside access"
if [[ $(cat "$CONF_DIR/ddlsim.conf" 2>/dev/null) != "$WANTED" ]]; then
    say "listening on $HOST only ($CONF_DIR/ddlsim.conf)"
    mkdir -p "$CONF_DIR"
    echo "$WANTED" >"$CONF_DIR/ddlsim.conf"
    if [[ $(status) == online ]]; then
        pg_ctlcluster "$VERSION" "$CLUSTER" restart >&2 || die "restarting the cluster failed"
    fi
fi

if [[ $(status) != online ]]; then
    say "starting cluster $VERSION/$CLUSTER on $HOST:$PORT"
    pg_ctlcluster "$VERSION" "$CLUSTER" start >&2 \
        || die "pg_ctlcluster $VERSION $CLUSTER start failed; see /var/log/postgresql/postgresql-$VERSION-$CLUSTER.log"
fi

for _ in $(seq 1 30); do
    pg_isready -q -h "$HOST" -p "$PORT" && break
    sleep 1
done
pg_isready -q -h "$HOST" -p "$PORT" || die "server on $HOST:$PORT is not accepting connections after 30 s"

as_postgres() { runuser -u postgres -- psql -p "$PORT" -X -q -v ON_ERROR_STOP=1 -tA "$@"; }

if [[ $(as_postgres -c "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'") != 1 ]]; then
    say "creating role $ROLE"
    as_postgres -c "CREATE ROLE $ROLE LOGIN PASSWORD '$PASSWORD'" || die "CREATE ROLE failed"
else
    as_postgres -c "ALTER ROLE $ROLE LOGIN PASSWORD '$PASSWORD'" || die "ALTER ROLE failed"
fi
if [[ $(as_postgres -c "SELECT 1 FROM pg_database WHERE datname = '$DATABASE'") != 1 ]]; then
    say "creating database $DATABASE"
    as_postgres -c "CREATE DATABASE $DATABASE OWNER $ROLE" || die "CREATE DATABASE failed"
fi

PGPASSWORD=$PASSWORD psql -X -q -h "$HOST" -p "$PORT" -U "$ROLE" -d "$DATABASE" -tAc "SELECT 1" \
    >/dev/null || die "cannot log in as $ROLE to $DATABASE on $HOST:$PORT"

say "ready: PostgreSQL $VERSION on $HOST:$PORT, database $DATABASE"
echo "export DDLSIM_TEST_POSTGRES_URL=postgresql+psycopg://$ROLE:$PASSWORD@$HOST:$PORT/$DATABASE"
