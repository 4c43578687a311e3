//! Store budgets: a StoreBudget caps the requests and bytes per second all
//! of Ferry's workers together send to one bucket; this module splits it.
//!
//! Once a second the leader counts, from the caches, the workers that run
//! (or are about to) against each budgeted bucket, splits the budget
//! equally among them, and writes the split where it is read:
//! - each DataStage's `status.storeBudget`, which its workers read back in
//!   the answer to every progress report (every 2 s) and follow without
//!   restarting;
//! - the StoreBudget's own status, and the operator's metrics.
//!
//! New workers do not wait for the loop: the controller puts the share they
//! will have (counting them) on their command line ([`share_for_new_workers`]).
//! Until the others hear of them, the bucket may see more than its budget
//! for up to the loop's period plus one report interval. DataStages that
//! start together each count the others' new workers ([`StartingWorkers`]).
//!
//! The split is written with a field manager of its own, so the
//! controller's status apply (which does not set `storeBudget`) leaves it
//! alone, and removing the field is applying a status without it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_contract::{ObjectLocation, Scheme, StoreShare};
use ferry_crds::{DataStage, DataStageBudget, StoreBudget, StoreBudgetStatus};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource as _, ResourceExt as _};
use serde_json::json;

use crate::cache::Caches;
use crate::context::Context;
use crate::metrics::BudgetFigures;
pub use crate::starting::{Starting, StartingWorkers, WorkerCounts};

/// The field manager of `status.storeBudget` and of StoreBudget statuses.
pub const FIELD_MANAGER: &str = ferry_crds::names::BUDGETS_MANAGER;

/// How often the split is brought up to date.
const PERIOD: Duration = Duration::from_secs(1);

/// A DataStage's store as budgets name it: scheme, bucket, endpoint.
fn store_of(ds: &DataStage) -> Option<(Scheme, String, Option<String>)> {
    let plan = ds.spec.plan().ok()?;
    Some((plan.location.scheme, plan.location.bucket, plan.store.endpoint.clone()))
}

/// The budget that applies to bucket `bucket` of scheme `scheme` at
/// `endpoint`: of several covering it, the first by name (the others say
/// so in their status).
fn applying<'a>(
    budgets: &'a [Arc<StoreBudget>],
    scheme: Scheme,
    bucket: &str,
    endpoint: Option<&str>,
) -> Option<&'a Arc<StoreBudget>> {
    budgets.iter().filter(|b| b.spec.covers(scheme, bucket, endpoint)).min_by_key(|b| b.name_any())
}

/// The budget that applies to `ds`'s store.
fn budget_for<'a>(budgets: &'a [Arc<StoreBudget>], ds: &DataStage) -> Option<&'a Arc<StoreBudget>> {
    let (scheme, bucket, endpoint) = store_of(ds)?;
    applying(budgets, scheme, &bucket, endpoint.as_deref())
}

/// Workers (pods) a Job runs: its parallelism, 1 unless sharded.
fn pods_of(job: &Job) -> u32 {
    job.spec.as_ref().and_then(|s| s.parallelism).and_then(|p| u32::try_from(p).ok()).unwrap_or(1).max(1)
}

/// Whether a worker Job is done (or going): its pods no longer count.
fn job_over(job: &Job) -> bool {
    let finished = job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|conditions| {
        conditions.iter().any(|c| matches!(c.type_.as_str(), "Complete" | "Failed") && c.status == "True")
    });
    finished || job.metadata.deletion_timestamp.is_some()
}

/// Workers that run or are about to, per DataStage (namespace, name),
/// counted from their Jobs: the operator creates those itself, so a
/// DataStage's workers count from the moment it decides to start them,
/// before the Job controller and the scheduler have made their pods.
/// Workers whose Jobs are being created count as well ([`StartingWorkers`]).
pub fn active_workers(ctx: &Context, datastages: &[Arc<DataStage>]) -> WorkerCounts {
    let starting = ctx.starting.counts();
    active_workers_with(ctx, datastages, &starting)
}

fn active_workers_with(ctx: &Context, datastages: &[Arc<DataStage>], starting: &WorkerCounts) -> WorkerCounts {
    let mut workers = BTreeMap::new();
    for ds in datastages {
        let key = (ds.namespace().unwrap_or_default(), ds.name_any());
        let Some(home) = ctx.home(ds) else { continue };
        let mut jobs = Caches::of_home(&ctx.caches.jobs, &home, ferry_crds::names::WORKER);
        ctx.caches.created.fill_in(&home.datastage, &mut jobs);
        let created: u32 = jobs.iter().filter(|job| !job_over(job)).map(pods_of).sum();
        let running = created.saturating_add(starting.get(&key).copied().unwrap_or(0));
        if running > 0 {
            workers.insert(key, running);
        }
    }
    workers
}

/// One budget's split.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BudgetSplit {
    /// Workers sharing it.
    pub workers: u32,
    /// DataStages those workers belong to.
    pub datastages: u32,
    /// Each worker's share.
    pub share: StoreShare,
    /// Throttled requests the workers of the covered DataStages reported.
    pub throttled: i64,
    /// Another budget that covers the same store and applies instead.
    pub shadowed_by: Option<String>,
}

/// The split of every budget and what each DataStage's `status.storeBudget`
/// should be (`None`: absent).
#[derive(Debug, Default, PartialEq)]
pub struct Split {
    /// By StoreBudget name.
    pub budgets: BTreeMap<String, BudgetSplit>,
    /// By DataStage (namespace, name), for those whose field must change.
    pub datastages: BTreeMap<(String, String), Option<DataStageBudget>>,
}

/// Splits every budget among the active `workers` of each DataStage (pure).
pub fn split(budgets: &[Arc<StoreBudget>], datastages: &[Arc<DataStage>], workers: &WorkerCounts) -> Split {
    let key = |ds: &DataStage| (ds.namespace().unwrap_or_default(), ds.name_any());
    let mut out = Split::default();
    for budget in budgets {
        out.budgets.insert(budget.name_any(), BudgetSplit::default());
    }
    // Each DataStage with the budget that applies to it and its workers.
    let under: Vec<(&Arc<DataStage>, Option<&Arc<StoreBudget>>, u32)> = datastages
        .iter()
        .map(|ds| (ds, budget_for(budgets, ds), workers.get(&key(ds)).copied().unwrap_or(0)))
        .collect();
    for &(ds, budget, running) in &under {
        let Some(budget) = budget else { continue };
        let entry = out.budgets.get_mut(&budget.name_any()).expect("every budget has an entry");
        entry.workers += running;
        entry.datastages += u32::from(running > 0);
        let status = ds.status.as_ref();
        entry.throttled += status.map_or(0, |s| s.workers.iter().filter_map(|w| w.throttled_requests).sum::<i64>());
    }
    for budget in budgets {
        let entry = out.budgets.get_mut(&budget.name_any()).expect("every budget has an entry");
        entry.share = budget.spec.share(entry.workers);
        let own: Option<ObjectLocation> = budget.spec.uri.parse().ok();
        let first = own.and_then(|own| applying(budgets, own.scheme, &own.bucket, budget.spec.endpoint.as_deref()));
        entry.shadowed_by = first.map(|b| b.name_any()).filter(|name| *name != budget.name_any());
    }
    for (ds, budget, running) in under {
        let current = ds.status.as_ref().and_then(|s| s.store_budget.clone());
        let wanted = match (running, budget) {
            (0, _) => None,
            (_, Some(budget)) => {
                let split = &out.budgets[&budget.name_any()];
                Some(DataStageBudget {
                    name: Some(budget.name_any()),
                    workers: i64::from(split.workers),
                    share: split.share,
                })
            }
            // Running without a budget: its workers must hear that the one
            // they follow is gone; one that never had one needs no word.
            (_, None) => current.as_ref().map(|_| DataStageBudget::default()),
        };
        if wanted != current {
            out.datastages.insert(key(ds), wanted);
        }
    }
    out
}

/// The share the workers about to start for `ds` will have: its budget
/// split among the workers running or starting against the bucket now and
/// `new_workers` more, who count as starting until the returned
/// [`Starting`] is dropped (once their Jobs are recorded as created).
/// `None` when no budget covers its store.
pub fn share_for_new_workers(ctx: &Context, ds: &DataStage, new_workers: u32) -> Option<(StoreShare, Starting)> {
    let budgets = ctx.caches.budgets.state();
    let budget = budget_for(&budgets, ds)?;
    let datastages = ctx.caches.datastages.state();
    let key = (ds.namespace().unwrap_or_default(), ds.name_any());
    ctx.starting.reserve(key, new_workers, |starting| {
        let workers = active_workers_with(ctx, &datastages, starting);
        Some(share_beside(&budgets, &datastages, &workers, budget, new_workers))
    })
}

/// `budget`'s share for each of `new_workers` more workers beside those
/// `workers` counts (pure).
fn share_beside(
    budgets: &[Arc<StoreBudget>],
    datastages: &[Arc<DataStage>],
    workers: &WorkerCounts,
    budget: &StoreBudget,
    new_workers: u32,
) -> StoreShare {
    let split = split(budgets, datastages, workers);
    budget.spec.share(split.budgets[&budget.name_any()].workers.saturating_add(new_workers))
}

/// The StoreBudget status for a split.
fn budget_status(budget: &StoreBudget, split: &BudgetSplit) -> StoreBudgetStatus {
    let (status, reason, message) = match &split.shadowed_by {
        Some(other) => (
            "False",
            "Shadowed",
            format!("StoreBudget {other} covers the same bucket and endpoint and applies instead; delete one of them"),
        ),
        None => ("True", "Split", format!("split among {} workers of {} DataStages", split.workers, split.datastages)),
    };
    let previous = budget.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    let since = previous
        .filter(|c| c.status == status && c.reason == reason)
        .map_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()), |c| c.last_transition_time.clone());
    StoreBudgetStatus {
        observed_generation: budget.metadata.generation,
        data_stages: i64::from(split.datastages),
        workers: i64::from(split.workers),
        share: Some(split.share.to_string()),
        throttled_requests: split.throttled,
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time: since,
            observed_generation: budget.metadata.generation,
        }],
    }
}

/// Keeps every split current until the process stops.
pub async fn run(ctx: Arc<Context>) {
    ctx.caches.ready().await;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let budgets_api: Api<StoreBudget> = Api::all(ctx.client.clone());
    let mut known: Vec<String> = Vec::new();
    let mut ticks = tokio::time::interval(PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let budgets = ctx.caches.budgets.state();
        let datastages = ctx.caches.datastages.state();
        // Most clusters have no budget: then there is nothing to count,
        // unless a DataStage still shows one that was deleted.
        let shown = |ds: &Arc<DataStage>| ds.status.as_ref().is_some_and(|s| s.store_budget.is_some());
        if budgets.is_empty() && known.is_empty() && !datastages.iter().any(shown) {
            continue;
        }
        let split = split(&budgets, &datastages, &active_workers(&ctx, &datastages));
        // At once: a budget shared by many DataStages changes all their
        // shares together, and the last written should not wait for the first.
        let writes = split.datastages.iter().map(|((namespace, name), wanted)| {
            let api: Api<DataStage> = Api::namespaced(ctx.client.clone(), namespace);
            let patch = json!({
                "apiVersion": DataStage::api_version(&()), "kind": DataStage::kind(&()),
                "metadata": {"name": name, "namespace": namespace},
                "status": wanted.as_ref().map_or_else(|| json!({}), |budget| json!({"storeBudget": budget})),
            });
            let params = &params;
            async move {
                if let Err(error) = api.patch_status(name, params, &Patch::Apply(&patch)).await {
                    tracing::warn!(%error, %namespace, datastage = %name, "cannot write the DataStage's store budget share");
                }
            }
        });
        futures::future::join_all(writes).await;
        for budget in &budgets {
            let name = budget.name_any();
            let figures = &split.budgets[&name];
            let status = budget_status(budget, figures);
            ctx.metrics.observe_budget(
                &name,
                Some(BudgetFigures {
                    workers: status.workers,
                    datastages: status.data_stages,
                    share_requests_per_second: figures.share.requests_per_second.map_or(0, i64::from),
                    share_bytes_per_second: figures
                        .share
                        .bytes_per_second
                        .map_or(0, |b| i64::try_from(b).unwrap_or(i64::MAX)),
                    throttled_requests: status.throttled_requests,
                }),
            );
            if budget.status.as_ref() == Some(&status) {
                continue;
            }
            let patch = json!({
                "apiVersion": StoreBudget::api_version(&()), "kind": StoreBudget::kind(&()),
                "metadata": {"name": name}, "status": status,
            });
            if let Err(error) = budgets_api.patch_status(&name, &params, &Patch::Apply(&patch)).await {
                tracing::warn!(%error, budget = %name, "cannot write the StoreBudget's status");
            }
        }
        let names: Vec<String> = budgets.iter().map(|b| b.name_any()).collect();
        for gone in known.iter().filter(|n| !names.contains(n)) {
            ctx.metrics.observe_budget(gone, None);
        }
        known = names;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(name: &str, uri: &str, endpoint: Option<&str>, rps: i32) -> Arc<StoreBudget> {
        Arc::new(
            serde_json::from_value(json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "StoreBudget",
                "metadata": {"name": name}, "spec": {"uri": uri, "endpoint": endpoint, "requestsPerSecond": rps}}))
            .unwrap(),
        )
    }

    fn datastage(name: &str, uri: &str, endpoint: Option<&str>, status: serde_json::Value) -> Arc<DataStage> {
        Arc::new(
            serde_json::from_value(json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
                "metadata": {"name": name, "namespace": "ml"},
                "spec": {"source": {"uri": uri, "endpoint": endpoint}, "destination": {"volume": {"hostPath": "/mnt/d"}}},
                "status": status}))
            .unwrap(),
        )
    }

    fn workers(counts: &[(&str, u32)]) -> BTreeMap<(String, String), u32> {
        counts.iter().map(|(name, n)| (("ml".to_owned(), (*name).to_owned()), *n)).collect()
    }

    fn job(parallelism: i32, conditions: serde_json::Value) -> Job {
        serde_json::from_value(json!({"metadata": {"name": "j"}, "spec": {"parallelism": parallelism, "template": {}},
            "status": {"conditions": conditions}}))
        .unwrap()
    }

    #[test]
    fn datastages_that_start_at_once_count_each_others_new_workers() {
        let budgets = vec![budget("shared", "s3://shared", None, 80)];
        let datastages: Vec<Arc<DataStage>> =
            (0..20).map(|i| datastage(&format!("d{i:02}"), "s3://shared/set", None, json!({}))).collect();
        let book = Arc::new(StartingWorkers::default());
        let (decided, all_decided) = (std::sync::Barrier::new(20), std::sync::Barrier::new(20));
        // Twenty reconciliations decide at once and hold their count until
        // every one has decided (their Jobs not yet created).
        let mut shares: Vec<u32> = std::thread::scope(|scope| {
            let threads: Vec<_> = datastages
                .iter()
                .map(|ds| {
                    let (book, budgets, datastages) = (&book, &budgets, &datastages);
                    let (decided, all_decided) = (&decided, &all_decided);
                    scope.spawn(move || {
                        decided.wait();
                        let key = ("ml".to_owned(), ds.name_any());
                        let (share, starting) = book
                            .reserve(key, 2, |starting| {
                                Some(share_beside(budgets, datastages, starting, &budgets[0], 2))
                            })
                            .expect("a budget applies");
                        all_decided.wait();
                        drop(starting);
                        share.requests_per_second.expect("a request rate")
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        shares.sort_unstable_by(|a, b| b.cmp(a));
        // The k-th to decide counted the 2(k-1) workers decided before it
        // and its own two: never more than the budget over 2k each.
        for (k, share) in (1u32..).zip(&shares) {
            assert!(share * 2 * k <= 80, "decision {k} of 20 gave each of 2 workers {share}/s: {shares:?}");
        }
        assert!(book.counts().is_empty(), "counted only until dropped: {:?}", book.counts());
    }

    #[test]
    fn starting_workers_add_up_per_datastage_and_a_refused_decision_counts_nobody() {
        let book = Arc::new(StartingWorkers::default());
        let key = |name: &str| ("ml".to_owned(), name.to_owned());
        let (_, first) = book.reserve(key("a"), 2, |_| Some(())).unwrap();
        let (seen, second) = book.reserve(key("a"), 3, |starting| Some(starting.clone())).unwrap();
        assert_eq!(seen, workers(&[("a", 2)]), "the second decision sees the first's workers");
        assert!(book.reserve(key("b"), 4, |_| None::<()>).is_none());
        assert_eq!(book.counts(), workers(&[("a", 5)]), "nobody counted for a refused decision");
        drop(first);
        assert_eq!(book.counts(), workers(&[("a", 3)]));
        drop(second);
        assert!(book.counts().is_empty());
    }

    #[test]
    fn a_job_counts_its_pods_until_it_is_over() {
        assert_eq!(pods_of(&job(3, json!([]))), 3);
        assert!(!job_over(&job(1, json!([{"type": "Suspended", "status": "True"}]))));
        assert!(job_over(&job(1, json!([{"type": "Complete", "status": "True"}]))));
        assert!(job_over(&job(1, json!([{"type": "Failed", "status": "True"}]))));
        assert!(!job_over(&job(1, json!([{"type": "Failed", "status": "False"}]))));
    }

    #[test]
    fn a_budget_is_split_among_the_running_workers_of_every_datastage_against_its_bucket() {
        let minio = Some("http://minio:9000");
        let budgets = [budget("minio", "s3://data", minio, 100)];
        let datastages = [
            datastage("a", "s3://data/train", minio, json!({"workers": [{"name": "n1", "throttledRequests": 3}]})),
            datastage("b", "s3://data/eval", Some("http://minio:9000/"), json!({})),
            datastage("other-bucket", "s3://logs", minio, json!({})),
            datastage("other-store", "s3://data", None, json!({})),
        ];
        let running = workers(&[("a", 2), ("b", 1), ("other-bucket", 1), ("other-store", 1)]);
        let split = split(&budgets, &datastages, &running);
        let minio_split = &split.budgets["minio"];
        assert_eq!((minio_split.workers, minio_split.datastages, minio_split.throttled), (3, 2, 3));
        assert_eq!(minio_split.share.requests_per_second, Some(33));
        let share = DataStageBudget { name: Some("minio".into()), workers: 3, share: minio_split.share };
        assert_eq!(split.datastages[&("ml".into(), "a".into())], Some(share.clone()));
        assert_eq!(split.datastages[&("ml".into(), "b".into())], Some(share));
        assert_eq!(split.datastages.len(), 2, "nothing to write for unbudgeted stores: {:?}", split.datastages);
    }

    #[test]
    fn finished_datastages_lose_the_field_and_running_ones_hear_when_their_budget_goes() {
        let had = json!({"storeBudget": {"name": "gone", "workers": 2, "share": {"requestsPerSecond": 5}}});
        let datastages =
            [datastage("done", "s3://data", None, had.clone()), datastage("running", "s3://data", None, had)];
        let running = workers(&[("running", 1)]);
        let split = split(&[], &datastages, &running);
        assert_eq!(split.datastages[&("ml".into(), "done".into())], None);
        assert_eq!(split.datastages[&("ml".into(), "running".into())], Some(DataStageBudget::default()));
        // Once told, nothing more to write.
        let told = [datastage("running", "s3://data", None, json!({"storeBudget": {"workers": 0, "share": {}}}))];
        assert!(super::split(&[], &told, &running).datastages.is_empty());
    }

    #[test]
    fn of_two_budgets_on_one_bucket_the_first_by_name_applies_and_the_other_says_so() {
        let budgets = [budget("b-second", "s3://data", None, 10), budget("a-first", "s3://data/", None, 40)];
        let datastages = [datastage("d", "s3://data/x", None, json!({}))];
        let split = split(&budgets, &datastages, &workers(&[("d", 1)]));
        assert_eq!(split.budgets["a-first"].share.requests_per_second, Some(40));
        assert_eq!(split.budgets["b-second"].shadowed_by.as_deref(), Some("a-first"));
        assert_eq!(split.budgets["b-second"].workers, 0);
        let status = budget_status(&budgets[0], &split.budgets["b-second"]);
        assert_eq!((status.conditions[0].status.as_str(), status.conditions[0].reason.as_str()), ("False", "Shadowed"));
    }
}
