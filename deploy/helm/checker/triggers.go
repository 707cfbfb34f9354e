package main

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	"github.com/kedacore/keda/v2/pkg/scalers/scalersconfig"
)

// A trigger's metadata is a map of strings: the strict decode cannot see a misspelt key
// (`lagTreshold` is silently the default, 10) or a value KEDA would refuse. So each trigger type
// the chart renders has its parameters declared here, as KEDA v2.20.2 declares them in
// pkg/scalers/kafka_scaler.go (kafkaMetadata) and prometheus_scaler.go (prometheusMetadata), and
// the metadata is parsed by KEDA's own parser (scalersconfig.TypedConfig: types, enums,
// required parameters); a key none of them names is an error. Auth parameters
// (username, password, ca, ...) come from the TriggerAuthentication, not from here.

type kafkaTrigger struct {
	TriggerIndex int

	BootstrapServers                   []string `keda:"name=bootstrapServers,order=triggerMetadata;resolvedEnv"`
	ConsumerGroup                      string   `keda:"name=consumerGroup,order=triggerMetadata;resolvedEnv"`
	Topic                              string   `keda:"name=topic,order=triggerMetadata;resolvedEnv,optional"`
	PartitionLimitation                string   `keda:"name=partitionLimitation,order=triggerMetadata,optional"`
	LagThreshold                       int64    `keda:"name=lagThreshold,order=triggerMetadata,default=10"`
	ActivationLagThreshold             int64    `keda:"name=activationLagThreshold,order=triggerMetadata,default=0"`
	OffsetResetPolicy                  string   `keda:"name=offsetResetPolicy,order=triggerMetadata,default=latest,enum=latest;earliest"`
	AllowIdleConsumers                 bool     `keda:"name=allowIdleConsumers,order=triggerMetadata,default=false"`
	ExcludePersistentLag               bool     `keda:"name=excludePersistentLag,order=triggerMetadata,default=false"`
	ScaleToZeroOnInvalidOffset         bool     `keda:"name=scaleToZeroOnInvalidOffset,order=triggerMetadata,default=false"`
	LimitToPartitionsWithLag           bool     `keda:"name=limitToPartitionsWithLag,order=triggerMetadata,default=false"`
	EnsureEvenDistributionOfPartitions bool     `keda:"name=ensureEvenDistributionOfPartitions,order=triggerMetadata,default=false"`
	Version                            string   `keda:"name=version,order=triggerMetadata,optional"`
	TLS                                string   `keda:"name=tls,order=triggerMetadata;authParams,default=disable,enum=enable;disable"`
	UnsafeSsl                          bool     `keda:"name=unsafeSsl,order=triggerMetadata,default=false"`
	Sasl                               string   `keda:"name=sasl,order=triggerMetadata;authParams,optional,enum=none;plaintext;scram_sha256;scram_sha512;oauthbearer;gssapi"`
	SaslTokenProvider                  string   `keda:"name=saslTokenProvider,order=triggerMetadata;authParams,optional,enum=bearer;aws_msk_iam"`
	AWSRegion                          string   `keda:"name=awsRegion,order=triggerMetadata,optional"`
}

// Validate: the rules of KEDA's kafkaMetadata.Validate that need no broker.
func (k *kafkaTrigger) Validate() error {
	switch {
	case k.LagThreshold <= 0:
		return fmt.Errorf("lagThreshold must be a positive number")
	case k.ActivationLagThreshold < 0:
		return fmt.Errorf("activationLagThreshold must not be negative")
	case k.AllowIdleConsumers && k.LimitToPartitionsWithLag:
		return fmt.Errorf("allowIdleConsumers and limitToPartitionsWithLag cannot be set together")
	case k.Topic == "" && (k.LimitToPartitionsWithLag || k.EnsureEvenDistributionOfPartitions):
		return fmt.Errorf("limitToPartitionsWithLag and ensureEvenDistributionOfPartitions need a topic")
	}
	return nil
}

type prometheusTrigger struct {
	TriggerIndex int

	ServerAddress       string            `keda:"name=serverAddress,order=triggerMetadata"`
	Query               string            `keda:"name=query,order=triggerMetadata"`
	QueryParameters     map[string]string `keda:"name=queryParameters,order=triggerMetadata,optional"`
	Threshold           float64           `keda:"name=threshold,order=triggerMetadata"`
	ActivationThreshold float64           `keda:"name=activationThreshold,order=triggerMetadata,optional"`
	Namespace           string            `keda:"name=namespace,order=triggerMetadata,optional"`
	CustomHeaders       map[string]string `keda:"name=customHeaders,order=triggerMetadata,optional"`
	IgnoreNullValues    bool              `keda:"name=ignoreNullValues,order=triggerMetadata,default=true"`
	UnsafeSSL           bool              `keda:"name=unsafeSsl,order=triggerMetadata,optional"`
	AwsRegion           string            `keda:"name=awsRegion,order=triggerMetadata;authParams,optional"`
	Timeout             time.Duration     `keda:"name=timeout,order=triggerMetadata,optional"`
	IdentityOwner       string            `keda:"name=identityOwner,order=triggerMetadata,optional"`
	AuthModes           string            `keda:"name=authModes,order=triggerMetadata;authParams,optional"`
}

// Validate: the threshold KEDA divides the query's value by.
func (p *prometheusTrigger) Validate() error {
	if p.Threshold <= 0 {
		return fmt.Errorf("threshold must be a positive number")
	}
	return nil
}

var triggerTypes = map[string]func() any{
	"kafka":      func() any { return &kafkaTrigger{} },
	"prometheus": func() any { return &prometheusTrigger{} },
}

// checkTriggers parses each trigger's metadata as KEDA would, and refuses keys it would ignore.
func checkTriggers(triggers []kedav1alpha1.ScaleTriggers) []string {
	var problems []string
	for i, t := range triggers {
		make, known := triggerTypes[t.Type]
		if !known {
			problems = append(problems, fmt.Sprintf("trigger %d: type %q is not declared in triggers.go (its metadata would go unchecked)", i, t.Type))
			continue
		}
		typed := make()
		config := scalersconfig.ScalerConfig{TriggerType: t.Type, TriggerName: t.Name, TriggerIndex: i,
			TriggerMetadata: t.Metadata, AuthParams: map[string]string{}, ResolvedEnv: map[string]string{}}
		if err := config.TypedConfig(typed); err != nil {
			problems = append(problems, fmt.Sprintf("trigger %d (%s): %v", i, t.Type, err))
		}
		declared := declaredParameters(typed)
		var unknown []string
		for key := range t.Metadata {
			if !declared[strings.TrimSuffix(key, "FromEnv")] {
				unknown = append(unknown, key)
			}
		}
		sort.Strings(unknown)
		for _, key := range unknown {
			problems = append(problems, fmt.Sprintf("trigger %d (%s): metadata %q is no parameter of the %s scaler (KEDA would ignore it)", i, t.Type, key, t.Type))
		}
	}
	return problems
}

// declaredParameters: the parameter names the `keda` tags of a trigger's struct declare.
func declaredParameters(typed any) map[string]bool {
	names := map[string]bool{}
	t := reflect.TypeOf(typed).Elem()
	for i := 0; i < t.NumField(); i++ {
		tag, ok := t.Field(i).Tag.Lookup("keda")
		if !ok {
			continue
		}
		for _, part := range strings.Split(tag, ",") {
			if name, found := strings.CutPrefix(strings.TrimSpace(part), "name="); found {
				for _, n := range strings.Split(name, ";") {
					names[strings.TrimSpace(n)] = true
				}
			}
		}
	}
	return names
}
