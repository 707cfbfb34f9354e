package main

import (
	"fmt"
	"sort"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// kinds: every kind the checker knows, and the upstream Go type it is decoded into.
var kinds = map[schema.GroupVersionKind]func() any{
	corev1.SchemeGroupVersion.WithKind("ConfigMap"):             func() any { return &corev1.ConfigMap{} },
	corev1.SchemeGroupVersion.WithKind("Secret"):                func() any { return &corev1.Secret{} },
	corev1.SchemeGroupVersion.WithKind("Service"):               func() any { return &corev1.Service{} },
	corev1.SchemeGroupVersion.WithKind("ServiceAccount"):        func() any { return &corev1.ServiceAccount{} },
	appsv1.SchemeGroupVersion.WithKind("Deployment"):            func() any { return &appsv1.Deployment{} },
	batchv1.SchemeGroupVersion.WithKind("Job"):                  func() any { return &batchv1.Job{} },
	policyv1.SchemeGroupVersion.WithKind("PodDisruptionBudget"): func() any { return &policyv1.PodDisruptionBudget{} },
	networkingv1.SchemeGroupVersion.WithKind("NetworkPolicy"):   func() any { return &networkingv1.NetworkPolicy{} },
	autoscalingv2.SchemeGroupVersion.WithKind("HorizontalPodAutoscaler"): func() any {
		return &autoscalingv2.HorizontalPodAutoscaler{}
	},
	monitoringv1.SchemeGroupVersion.WithKind("ServiceMonitor"): func() any { return &monitoringv1.ServiceMonitor{} },
	monitoringv1.SchemeGroupVersion.WithKind("PrometheusRule"): func() any { return &monitoringv1.PrometheusRule{} },
	kedav1alpha1.SchemeGroupVersion.WithKind("ScaledObject"):   func() any { return &kedav1alpha1.ScaledObject{} },
	kedav1alpha1.SchemeGroupVersion.WithKind("TriggerAuthentication"): func() any {
		return &kedav1alpha1.TriggerAuthentication{}
	},
}

// checkObject: what the API server (or KEDA's admission webhook) checks of one object that a
// strict decode cannot: its name, labels and annotations, and the rules of its kind.
func checkObject(obj object) []string {
	var problems []string
	add := func(errs field.ErrorList) {
		for _, e := range errs {
			problems = append(problems, e.Error())
		}
	}
	meta := objectMeta(obj.value)
	nameRule := apivalidation.NameIsDNSSubdomain
	if obj.gvk.Kind == "Service" {
		nameRule = apivalidation.NameIsDNS1035Label
	}
	add(apivalidation.ValidateObjectMeta(meta, false, nameRule, field.NewPath("metadata")))
	switch v := obj.value.(type) {
	case *appsv1.Deployment:
		problems = append(problems, checkSelector(v.Spec.Selector, v.Spec.Template.Labels, "spec.selector")...)
		problems = append(problems, checkPodSpec(&v.Spec.Template.Spec, v.Spec.Template.Labels)...)
	case *batchv1.Job:
		if p := v.Spec.Template.Spec.RestartPolicy; p != corev1.RestartPolicyNever && p != corev1.RestartPolicyOnFailure {
			problems = append(problems, fmt.Sprintf("spec.template.spec.restartPolicy %q: a Job's pods restart Never or OnFailure", p))
		}
		problems = append(problems, checkPodSpec(&v.Spec.Template.Spec, v.Spec.Template.Labels)...)
	case *policyv1.PodDisruptionBudget:
		if (v.Spec.MinAvailable == nil) == (v.Spec.MaxUnavailable == nil) {
			problems = append(problems, "spec: exactly one of minAvailable and maxUnavailable")
		}
		problems = append(problems, checkSelector(v.Spec.Selector, nil, "spec.selector")...)
	case *corev1.ConfigMap:
		for key := range v.Data {
			for _, msg := range validation.IsConfigMapKey(key) {
				problems = append(problems, fmt.Sprintf("data[%q]: %s", key, msg))
			}
		}
	case *autoscalingv2.HorizontalPodAutoscaler:
		if v.Spec.MinReplicas != nil && *v.Spec.MinReplicas > v.Spec.MaxReplicas {
			problems = append(problems, fmt.Sprintf("spec.minReplicas %d above spec.maxReplicas %d", *v.Spec.MinReplicas, v.Spec.MaxReplicas))
		}
		if v.Spec.MinReplicas != nil && *v.Spec.MinReplicas < 1 {
			problems = append(problems, "spec.minReplicas below 1")
		}
	case *monitoringv1.PrometheusRule:
		problems = append(problems, checkRuleGroups(v)...)
	case *kedav1alpha1.ScaledObject:
		problems = append(problems, checkScaledObject(v)...)
	}
	return problems
}

func objectMeta(value any) *metav1.ObjectMeta {
	switch v := value.(type) {
	case interface{ GetObjectMeta() metav1.Object }:
		if m, ok := v.GetObjectMeta().(*metav1.ObjectMeta); ok {
			return m
		}
	}
	panic(fmt.Sprintf("no ObjectMeta on %T", value))
}

// checkPodSpec: the references inside one pod template, and that its own topology spread
// constraints count its pods.
func checkPodSpec(spec *corev1.PodSpec, labels map[string]string) []string {
	var problems []string
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		if volumes[v.Name] {
			problems = append(problems, fmt.Sprintf("volume %q given twice", v.Name))
		}
		volumes[v.Name] = true
	}
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		ports := map[string]bool{}
		for _, p := range c.Ports {
			if p.Name != "" {
				ports[p.Name] = true
			}
		}
		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				problems = append(problems, fmt.Sprintf("container %q mounts volume %q, which the pod does not have", c.Name, m.Name))
			}
		}
		seen := map[string]bool{}
		for _, e := range c.Env {
			if seen[e.Name] {
				problems = append(problems, fmt.Sprintf("container %q: env %s given twice", c.Name, e.Name))
			}
			seen[e.Name] = true
			if e.Value != "" && e.ValueFrom != nil {
				problems = append(problems, fmt.Sprintf("container %q: env %s has both value and valueFrom", c.Name, e.Name))
			}
		}
		for what, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
			if probe == nil || probe.HTTPGet == nil {
				continue
			}
			if port := probe.HTTPGet.Port; port.StrVal != "" && !ports[port.StrVal] {
				problems = append(problems, fmt.Sprintf("container %q: %s probe's port %q is none of its ports", c.Name, what, port.StrVal))
			}
		}
	}
	for i, t := range spec.TopologySpreadConstraints {
		where := fmt.Sprintf("spec.topologySpreadConstraints[%d].labelSelector", i)
		problems = append(problems, checkSelector(t.LabelSelector, labels, where)...)
	}
	sort.Strings(problems)
	return problems
}

// checkSelector: a selector that is valid, not empty, and (given the labels of the pods it is
// for) selects them.
func checkSelector(sel *metav1.LabelSelector, labels map[string]string, where string) []string {
	if sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0) {
		return []string{where + ": empty (it would select every pod of the namespace)"}
	}
	selector, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", where, err)}
	}
	if labels != nil && !selector.Matches(labelSet(labels)) {
		return []string{fmt.Sprintf("%s %s does not select its own pods (labels %v)", where, selector, labels)}
	}
	return nil
}

func checkRuleGroups(rule *monitoringv1.PrometheusRule) []string {
	var problems []string
	groups := map[string]bool{}
	for _, g := range rule.Spec.Groups {
		if groups[g.Name] {
			problems = append(problems, fmt.Sprintf("rule group %q given twice", g.Name))
		}
		groups[g.Name] = true
		for i, r := range g.Rules {
			if (r.Alert == "") == (r.Record == "") {
				problems = append(problems, fmt.Sprintf("group %q rule %d: exactly one of alert and record", g.Name, i))
			}
			if r.Expr.String() == "" {
				problems = append(problems, fmt.Sprintf("group %q rule %d: no expr", g.Name, i))
			}
		}
	}
	return problems
}
