package main

import (
	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
)

// checkScaledObject: what KEDA's admission webhook checks of a ScaledObject that needs no
// cluster (its replica bounds, its fallback, its triggers' names), with KEDA's own functions;
// then each trigger's metadata, parsed as its scaler would (triggers.go).
func checkScaledObject(so *kedav1alpha1.ScaledObject) []string {
	var problems []string
	for _, err := range []error{
		kedav1alpha1.CheckReplicaCountBoundsAreValid(so),
		kedav1alpha1.CheckFallbackValid(so),
		kedav1alpha1.ValidateTriggers(so.Spec.Triggers),
	} {
		if err != nil {
			problems = append(problems, err.Error())
		}
	}
	return append(problems, checkTriggers(so.Spec.Triggers)...)
}
