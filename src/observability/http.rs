//! The operator's HTTP endpoint (`--http-addr`): `GET /metrics` (Prometheus
//! text), `GET /healthz` (`200 ok` while the process runs) and `GET /readyz`
//! (`200` when [`evaluate`] finds nothing wrong, else
//! `503`; a JSON body with the reasons, warnings and the state judged).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{StatusCode, header::CONTENT_TYPE};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use tokio::net::TcpListener;

use super::health::{Health, SlotObservation, evaluate};

/// Serves on a bound listener until `shutdown` resolves.
pub async fn serve_on(
    listener: TcpListener,
    handle: PrometheusHandle,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    // The recorder's upkeep drains histogram samples: memory stays bounded when nobody scrapes.
    let upkeep_handle = handle.clone();
    let upkeep = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep_handle.run_upkeep();
        }
    });
    let metrics = || async move {
        let content_type = "text/plain; version=0.0.4; charset=utf-8";
        ([(CONTENT_TYPE, content_type)], handle.render())
    };
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(|| async move { readyz(&health) }));
    let result = axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await;
    upkeep.abort();
    result
}

fn readyz(health: &Health) -> (StatusCode, Json<serde_json::Value>) {
    let snapshot = health.snapshot(Instant::now());
    let readiness = evaluate(&snapshot, &health.thresholds());
    let slot = match &snapshot.slot {
        SlotObservation::Unknown => serde_json::Value::Null,
        SlotObservation::Missing => json!({ "exists": false }),
        SlotObservation::Seen(slot) => json!({
            "exists": true,
            "lag_bytes": slot.lag_bytes,
            "wal_status": slot.wal_status,
            "safe_wal_size_bytes": slot.safe_wal_size_bytes,
            "failover": slot.failover,
            "failover_ready": slot.failover_ready,
            "synchronized_standby_slots_set": slot.synchronized_standby_slots_set,
            "invalidated": slot.invalidated(),
            "idle_timeout_secs": slot.idle_timeout_secs,
        }),
    };
    let body = json!({
        "ready": readiness.ready,
        "reasons": readiness.reasons,
        "warnings": readiness.warnings,
        "streaming": snapshot.streaming,
        "producer_connected": snapshot.producer_connected,
        "ack_staleness_seconds": snapshot.ack_staleness.as_secs_f64(),
        "slot": slot,
    });
    let status = match readiness.ready {
        true => StatusCode::OK,
        false => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, Json(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observability::health::{ReadinessThresholds, SlotStatus, WalStatus};
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let status = response[9..12].parse().unwrap();
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }

    #[tokio::test]
    async fn endpoints_answer() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        ::metrics::with_local_recorder(&recorder, || {
            ::metrics::counter!(crate::observability::metrics::RECONNECTS_TOTAL).increment(3);
        });
        let health = Arc::new(Health::new(ReadinessThresholds::default()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_on(listener, handle, health.clone(), async {
            let _ = stopped.await;
        }));

        assert_eq!(get(addr, "/healthz").await, (200, "ok\n".to_owned()));
        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(body.contains("outbox_relay_reconnects_total 3"), "{body}");

        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503, "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["ready"], false);
        assert_eq!(json["reasons"].as_array().unwrap().len(), 2, "{json}");

        health.set_streaming(true);
        health.set_producer_connected(true);
        health.set_slot_observation(SlotObservation::Seen(SlotStatus {
            lag_bytes: Some(10),
            wal_status: WalStatus::Extended,
            safe_wal_size_bytes: Some(5 << 30),
            failover: None,
            synchronized_standby_slots_set: None,
            ..Default::default()
        }));
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 200, "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["ready"], true);
        assert_eq!(json["slot"]["wal_status"], "extended");
        assert_eq!(json["warnings"].as_array().unwrap().len(), 1, "{json}");

        let (status, _) = get(addr, "/nope").await;
        assert_eq!(status, 404);

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
