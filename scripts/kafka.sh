#!/usr/bin/env bash
# Run a real single-node Apache Kafka broker (KRaft) on 127.0.0.1 with the machine's Java.
#
#   scripts/kafka.sh up       fetch the broker jars once (Maven Central), format, start, wait
#   scripts/kafka.sh down     stop the broker by PID
#   scripts/kafka.sh status   print whether it runs
#   scripts/kafka.sh fetch    only fetch the jars
#
# Settings (environment): ARGUS_KAFKA_PORT (9092; the controller uses PORT+1),
# ARGUS_KAFKA_DATA (.argus/kafka in the repo), ARGUS_CACHE (~/.cache/argus, the jars),
# ARGUS_KAFKA_HEAP (512m). With ARGUS_KAFKA_SCRAM_USER and ARGUS_KAFKA_SCRAM_PASSWORD (or
# ARGUS_KAFKA_SCRAM_PASSWORD_FILE) set when the storage is first formatted, the broker also
# listens with SASL_PLAINTEXT (SCRAM-SHA-512) on PORT+2 for that user. With
# ARGUS_KAFKA_OAUTHBEARER=unsecured that listener also takes OAUTHBEARER, validated by Kafka's
# unsecured JWS handler (alg "none", any subject: for tests only, never in production).
# Either way the PLAINTEXT listener on PORT stays as it is.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/kafka/pom.xml")"
cache="${ARGUS_CACHE:-$HOME/.cache/argus}"
libs="$cache/kafka-$version/libs"
port="${ARGUS_KAFKA_PORT:-9092}"
cport="$((port + 1))"
data="${ARGUS_KAFKA_DATA:-$repo/.argus/kafka}"
pidfile="$data/broker.pid"
heap="${ARGUS_KAFKA_HEAP:-512m}"

log() { printf 'kafka: %s\n' "$*" >&2; }

running() { [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

fetch() {
  if [[ -f "$libs/.complete" ]]; then return 0; fi
  command -v mvn >/dev/null || { log "mvn not found: install Maven (apt-get install maven)"; exit 1; }
  command -v java >/dev/null || { log "java not found: install a JDK 17 or newer"; exit 1; }
  log "fetching Apache Kafka $version from Maven Central into $libs (once)"
  mkdir -p "$libs"
  mvn -q -B -f "$here/kafka/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$libs" -DincludeScope=runtime >"$cache/kafka-fetch.log" 2>&1 || {
    log "Maven could not fetch the broker; see $cache/kafka-fetch.log"; tail -5 "$cache/kafka-fetch.log" >&2; exit 1; }
  touch "$libs/.complete"
}

java_run() { java -Xmx"$heap" -Xms128m -XX:+UseG1GC -Dkafka.logs.dir="$data" \
  -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" -cp "$libs/*" "$@"; }

up() {
  if running; then log "already running (pid $(cat "$pidfile")) on 127.0.0.1:$port"; return 0; fi
  if port_open "$port"; then
    log "127.0.0.1:$port already answers (another broker, not started from $data); using it"
    return 0
  fi
  fetch
  mkdir -p "$data"
  sed -e "s#@PORT@#$port#g" -e "s#@CONTROLLER_PORT@#$cport#g" -e "s#@DATA@#$data#g" \
    "$here/kafka/server.properties.in" >"$data/server.properties"
  local scram_pw="${ARGUS_KAFKA_SCRAM_PASSWORD:-}" scram_args=() mechs=()
  if [[ -z "$scram_pw" && -n "${ARGUS_KAFKA_SCRAM_PASSWORD_FILE:-}" ]]; then scram_pw="$(<"$ARGUS_KAFKA_SCRAM_PASSWORD_FILE")"; fi
  if [[ -n "${ARGUS_KAFKA_SCRAM_USER:-}" && -n "$scram_pw" ]]; then
    mechs+=(SCRAM-SHA-512)
    scram_args=(--add-scram "SCRAM-SHA-512=[name=$ARGUS_KAFKA_SCRAM_USER,password=$scram_pw]")
  fi
  case "${ARGUS_KAFKA_OAUTHBEARER:-}" in
    "") ;;
    unsecured) mechs+=(OAUTHBEARER) ;;
    *) log "ARGUS_KAFKA_OAUTHBEARER must be 'unsecured' or unset"; exit 2 ;;
  esac
  if (( ${#mechs[@]} )); then
    local sport="$((port + 2))"
    cat >>"$data/server.properties" <<PROPS
# SASL_PLAINTEXT listener for clients that authenticate ($(IFS=,; echo "${mechs[*]}"))
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport,SASL_PLAINTEXT://127.0.0.1:$sport
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_PLAINTEXT://127.0.0.1:$sport
sasl.enabled.mechanisms=$(IFS=,; echo "${mechs[*]}")
PROPS
    if [[ " ${mechs[*]} " == *" SCRAM-SHA-512 "* ]]; then
      echo 'listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;' >>"$data/server.properties"
    fi
    if [[ " ${mechs[*]} " == *" OAUTHBEARER "* ]]; then
      cat >>"$data/server.properties" <<'PROPS'
listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="broker";
listener.name.sasl_plaintext.oauthbearer.sasl.server.callback.handler.class=org.apache.kafka.common.security.oauthbearer.internals.unsecured.OAuthBearerUnsecuredValidatorCallbackHandler
PROPS
    fi
  fi
  if [[ ! -f "$data/log/meta.properties" ]]; then
    local cluster
    cluster="$(java_run kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)"
    java_run kafka.tools.StorageTool format -t "$cluster" -c "$data/server.properties" "${scram_args[@]}" \
      >"$data/format.log" 2>&1 || {
      log "formatting KRaft storage failed:"; cat "$data/format.log" >&2; exit 1; }
  fi
  : >"$data/broker.log"
  nohup java -Xmx"$heap" -Xms128m -XX:+UseG1GC -Dkafka.logs.dir="$data" \
    -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" -cp "$libs/*" \
    kafka.Kafka "$data/server.properties" >"$data/stdout.log" 2>&1 &
  echo $! >"$pidfile"
  local start=$SECONDS
  until grep -q "Kafka Server started" "$data/broker.log" 2>/dev/null && port_open "$port"; do
    if ! running; then log "broker exited during start-up:"; tail -20 "$data/broker.log" "$data/stdout.log" >&2; exit 1; fi
    if (( SECONDS - start > 90 )); then log "broker did not answer within 90 s; see $data/broker.log"; exit 1; fi
    sleep 0.3
  done
  log "up on 127.0.0.1:$port (pid $(cat "$pidfile"), $((SECONDS - start)) s, data in $data)"
}

down() {
  if ! running; then log "not running"; rm -f "$pidfile"; return 0; fi
  local pid; pid="$(cat "$pidfile")"
  kill "$pid"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then log "no clean stop within 20 s, killing"; kill -9 "$pid"; fi
  rm -f "$pidfile"
  log "stopped (pid $pid)"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  fetch) fetch ;;
  status) if running; then echo "running (pid $(cat "$pidfile")) on 127.0.0.1:$port"; else echo "not running"; exit 1; fi ;;
  *) echo "usage: $0 up|down|status|fetch" >&2; exit 2 ;;
esac
