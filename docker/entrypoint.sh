#!/bin/bash
# Entry point of the Spark image: `cbgp <args>` for everything, except the two commands Spark on
# Kubernetes gives its pods (the image's ENTRYPOINT is kept and the pod's args are `driver ...` or
# `executor`, with the rest of the configuration in SPARK_* environment variables).
set -euo pipefail

case "${1:-}" in
  driver)
    shift
    # The pod IP is only known at run time; Spark passes it as SPARK_DRIVER_BIND_ADDRESS.
    exec "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    # Executor JVM options arrive as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... and must keep that order.
    java_opts=()
    for i in $(compgen -e | sed -n 's/^SPARK_JAVA_OPT_\([0-9]\+\)$/\1/p' | sort -n); do
      var="SPARK_JAVA_OPT_$i"
      java_opts+=("${!var}")
    done
    exec "$JAVA_HOME/bin/java" "${java_opts[@]}" \
      "-Xms$SPARK_EXECUTOR_MEMORY" "-Xmx$SPARK_EXECUTOR_MEMORY" \
      -cp "$SPARK_HOME/conf:$SPARK_HOME/jars/*" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" \
      --executor-id "$SPARK_EXECUTOR_ID" \
      --cores "$SPARK_EXECUTOR_CORES" \
      --app-id "$SPARK_APPLICATION_ID" \
      --hostname "$SPARK_EXECUTOR_POD_IP" \
      --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
      --podName "$SPARK_EXECUTOR_POD_NAME"
    ;;
  *)
    exec cbgp "$@"
    ;;
esac
