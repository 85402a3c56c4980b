//! A forwarded request's settlement: when its response is known, give back a charge its response
//! does not count (`count_if`) and charge or give back the difference to the real cost
//! (`settle`), through the ledger, without making the response wait.

use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use smallvec::SmallVec;

use super::decision::Decision;
use super::ledger::Ledger;
use crate::key::KeyValue;
use crate::rules::set::RuleSet;
use crate::rules::settle::{grpc_status, is_grpc, ResponseHead};

/// What a forwarded request whose rules count by outcome or settle carries until its response
/// is known. Dropped unused (the client went away before the response), it changes nothing:
/// the charge on arrival stays.
pub(crate) struct Settlement {
    ledger: Ledger,
    rules: Arc<RuleSet>,
    charged: SmallVec<[(usize, KeyValue, u64); 1]>,
}

impl Settlement {
    /// The settlement of an admitted decision, if any of its rules needs one.
    pub(crate) fn of(
        ledger: &Ledger,
        rules: &Arc<RuleSet>,
        decision: &Decision,
    ) -> Option<Box<Settlement>> {
        let charged: SmallVec<[(usize, KeyValue, u64); 1]> = decision
            .rules()
            .iter()
            .filter(|r| rules.rules[r.index].settles())
            .map(|r| (r.index, r.key.clone(), r.cost))
            .collect();
        (!charged.is_empty()).then(|| {
            Box::new(Settlement {
                ledger: ledger.clone(),
                rules: rules.clone(),
                charged,
            })
        })
    }

    /// Settles on the response head, or, for a gRPC response whose status is still to come in
    /// the trailers, gives itself back to wait for them.
    pub(crate) fn on_head(
        self: Box<Self>,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Option<Box<Self>> {
        let grpc_status = grpc_status(headers);
        if grpc_status.is_none() && is_grpc(headers) {
            return Some(self);
        }
        self.settle(&ResponseHead {
            status,
            headers,
            grpc_status,
        });
        None
    }

    /// Settles on a gRPC response's trailers.
    pub(crate) fn on_trailers(&self, status: StatusCode, trailers: &HeaderMap) {
        self.settle(&ResponseHead {
            status,
            headers: trailers,
            grpc_status: grpc_status(trailers),
        });
    }

    fn settle(&self, head: &ResponseHead<'_>) {
        for (index, key, cost) in &self.charged {
            let Some(rule) = self.rules.rules.get(*index) else {
                continue;
            };
            if let Some(count_if) = &rule.count_if {
                if !count_if.matches(head) {
                    self.ledger
                        .refund_now(&self.rules, &[(*index, key.clone(), *cost)]);
                    continue;
                }
            }
            let Some(settle) = &rule.settle else { continue };
            let capacity = rule.algorithm().capacity();
            let Some(real) = settle.real_cost(&rule.name, head, capacity) else {
                continue;
            };
            if real < *cost {
                self.ledger
                    .refund_now(&self.rules, &[(*index, key.clone(), cost - real)]);
            } else if real > *cost {
                self.ledger.owe_now(&self.rules, *index, key, real - cost);
            }
        }
    }
}
