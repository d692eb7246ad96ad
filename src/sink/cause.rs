//! PURE: why a read or a write of Kafka outside the producer's own deliveries failed (the
//! lineage topic, a partition's tail), classified once from librdkafka's error code, so each
//! cause gets its own message and remedy and a caller can tell a failure worth waiting out
//! from one a restart cannot fix.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// What kind of failure, as far as the remedy is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The brokers could not be reached or did not answer in time (down, restarting, a network
    /// blip, a partition without a leader for now): worth waiting out.
    Transport,
    /// The topic does not exist, and the broker did not create it.
    MissingTopic,
    /// The relay's principal may not use the topic (its ACLs).
    TopicDenied,
    /// The relay's principal may not use the consumer group (its ACLs).
    GroupDenied,
    /// Anything else (authentication, the cluster's ACLs, a broker error): a restart does not
    /// fix it.
    Other,
}

impl Cause {
    /// Classifies one of librdkafka's errors.
    pub fn of(error: &KafkaError) -> Cause {
        error
            .rdkafka_error_code()
            .map_or(Cause::Other, Cause::of_code)
    }

    /// Classifies one of librdkafka's error codes.
    pub fn of_code(code: RDKafkaErrorCode) -> Cause {
        use RDKafkaErrorCode as C;
        match code {
            C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::OperationTimedOut
            | C::RequestTimedOut
            | C::MessageTimedOut
            | C::Resolve
            | C::NetworkException
            | C::LeaderNotAvailable
            | C::NotLeaderForPartition
            | C::BrokerNotAvailable
            | C::ReplicaNotAvailable
            | C::CoordinatorLoadInProgress
            | C::CoordinatorNotAvailable
            | C::NotCoordinator
            | C::NotEnoughReplicas
            | C::NotController
            | C::KafkaStorageError
            | C::UnknownLeaderEpoch => Cause::Transport,
            C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition => {
                Cause::MissingTopic
            }
            C::TopicAuthorizationFailed => Cause::TopicDenied,
            C::GroupAuthorizationFailed => Cause::GroupDenied,
            _ => Cause::Other,
        }
    }

    /// Whether waiting (and trying again) can fix it: the brokers may come back; a missing
    /// topic or an ACL needs an operator.
    pub fn transient(self) -> bool {
        self == Cause::Transport
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_missing_topic_and_denied_acls_are_three_causes() {
        use RDKafkaErrorCode as C;
        // (error, cause, worth waiting out)
        let table = [
            (
                KafkaError::MetadataFetch(C::AllBrokersDown),
                Cause::Transport,
                true,
            ),
            (
                KafkaError::MetadataFetch(C::OperationTimedOut),
                Cause::Transport,
                true,
            ),
            (
                KafkaError::Global(C::BrokerTransportFailure),
                Cause::Transport,
                true,
            ),
            (
                KafkaError::MessageConsumption(C::NotLeaderForPartition),
                Cause::Transport,
                true,
            ),
            (
                KafkaError::MetadataFetch(C::LeaderNotAvailable),
                Cause::Transport,
                true,
            ),
            (
                KafkaError::MetadataFetch(C::Resolve),
                Cause::Transport,
                true,
            ),
            (
                KafkaError::MessageProduction(C::RequestTimedOut),
                Cause::Transport,
                true,
            ),
            (
                KafkaError::MetadataFetch(C::UnknownTopicOrPartition),
                Cause::MissingTopic,
                false,
            ),
            (
                KafkaError::MessageProduction(C::UnknownTopic),
                Cause::MissingTopic,
                false,
            ),
            (
                KafkaError::MetadataFetch(C::TopicAuthorizationFailed),
                Cause::TopicDenied,
                false,
            ),
            (
                KafkaError::MessageConsumption(C::GroupAuthorizationFailed),
                Cause::GroupDenied,
                false,
            ),
            (
                KafkaError::Global(C::SaslAuthenticationFailed),
                Cause::Other,
                false,
            ),
            (
                KafkaError::Global(C::ClusterAuthorizationFailed),
                Cause::Other,
                false,
            ),
            (KafkaError::Canceled, Cause::Other, false),
        ];
        for (error, cause, transient) in table {
            assert_eq!(Cause::of(&error), cause, "{error:?}");
            assert_eq!(Cause::of(&error).transient(), transient, "{error:?}");
        }
    }
}
