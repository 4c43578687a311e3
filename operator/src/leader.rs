//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas are
//! safe: only the holder reconciles, the other waits to take over.
//!
//! Every update carries the Lease's resourceVersion, so two candidates
//! cannot both win a race: the API server accepts one write and rejects the
//! other with a conflict. A leader that cannot renew within the lease
//! duration stops the process (as client-go's leader election does): a
//! restarted pod is simpler to reason about than a controller that stops
//! and starts again.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;

/// Name of the Lease the operator replicas compete for.
pub const LEASE_NAME: &str = "ferry-operator-leader";

/// One candidate.
#[derive(Clone)]
pub struct Elector {
    api: Api<Lease>,
    identity: String,
    duration: Duration,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector").field("identity", &self.identity).field("duration", &self.duration).finish()
    }
}

/// What a look at the Lease decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it, or the holder's lease expired: take it.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds a live lease.
    Wait,
}

/// Decides from a Lease's spec what `identity` should do at `now` (pure).
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = spec else { return Decision::Acquire };
    match spec.holder_identity.as_deref() {
        None | Some("") => Decision::Acquire,
        Some(holder) if holder == identity => Decision::Renew,
        Some(_) => {
            let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()).map(|t| t.0);
            let seconds = i64::from(spec.lease_duration_seconds.unwrap_or(15));
            match renewed {
                Some(at) if at + SignedDuration::from_secs(seconds) > now => Decision::Wait,
                _ => Decision::Acquire,
            }
        }
    }
}

impl Elector {
    /// A candidate named `identity` for the Lease in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, identity: String, duration: Duration) -> Self {
        Self { api: Api::namespaced(client, namespace), identity, duration }
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One attempt to acquire or renew; true when we hold the Lease after it.
    ///
    /// # Errors
    /// API errors other than a lost race.
    pub async fn try_lead(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let existing = self.api.get_opt(LEASE_NAME).await?;
        let decision = decide(existing.as_ref().and_then(|l| l.spec.as_ref()), &self.identity, now);
        if decision == Decision::Wait {
            return Ok(false);
        }
        let previous = existing.as_ref().and_then(|l| l.spec.clone()).unwrap_or_default();
        let transitions = previous.lease_transitions.unwrap_or(0) + i32::from(decision == Decision::Acquire);
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs().max(1) as i32),
            acquire_time: if decision == Decision::Acquire { Some(MicroTime(now)) } else { previous.acquire_time },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        };
        let result = match existing {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta { name: Some(LEASE_NAME.into()), ..ObjectMeta::default() },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Some(mut lease) => {
                // Keeps resourceVersion: a concurrent writer makes this fail with 409.
                lease.spec = Some(spec);
                self.api.replace(LEASE_NAME, &PostParams::default(), &lease).await
            }
        };
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Waits until this candidate holds the Lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_lead().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "leader election: cannot read or write the Lease"),
            }
            tokio::time::sleep(self.duration / 3).await;
        }
    }

    /// Renews the Lease until a renewal has not succeeded for a whole lease
    /// duration; then returns (the caller must stop leading).
    pub async fn keep_leading(&self) {
        let mut last_success = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.duration / 3).await;
            match self.try_lead().await {
                Ok(true) => last_success = tokio::time::Instant::now(),
                Ok(false) => return,
                Err(error) => tracing::warn!(%error, "leader election: renewal failed"),
            }
            if last_success.elapsed() > self.duration {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(renewed)),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_live_lease_of_another_holder_is_respected_until_it_expires() {
        let now = Timestamp::now();
        assert_eq!(decide(None, "me", now), Decision::Acquire);
        assert_eq!(decide(Some(&spec("me", now)), "me", now), Decision::Renew);
        assert_eq!(decide(Some(&spec("other", now)), "me", now), Decision::Wait);
        let stale = now - SignedDuration::from_secs(16);
        assert_eq!(decide(Some(&spec("other", stale)), "me", now), Decision::Acquire);
    }
}
