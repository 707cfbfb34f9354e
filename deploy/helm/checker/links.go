package main

import (
	"fmt"
	"strings"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

func labelSet(l map[string]string) labels.Set { return labels.Set(l) }

// problem: what is wrong between objects, and the object it is found on.
type problem struct {
	obj object
	msg string
}

// rendered: the objects of the manifests by kind and name, and whether each is a Helm hook.
type rendered struct {
	deployments []*appsv1.Deployment
	services    map[string]*corev1.Service
	names       map[string]bool // "Kind/name"
	hooks       map[string]bool // "Kind/name" of the pre-install hooks
	outside     externals
}

// checkLinks: the references between the rendered objects, which a cluster would accept and
// then silently do nothing with (a budget, policy, Service or monitor whose selector selects no
// pod, a scaler that names no Deployment, a ConfigMap that is never made), and the one Helm's
// order breaks: a pre-install hook runs before every object that is not a hook exists, so it must
// not read one. Secrets are the operator's own, made before the install: never checked here.
func checkLinks(objects []object, outside externals) []problem {
	r := rendered{services: map[string]*corev1.Service{}, names: map[string]bool{}, hooks: map[string]bool{}, outside: outside}
	for _, o := range objects {
		key := o.gvk.Kind + "/" + o.name
		r.names[key] = true
		if isPreInstallHook(o) {
			r.hooks[key] = true
		}
		switch v := o.value.(type) {
		case *appsv1.Deployment:
			r.deployments = append(r.deployments, v)
		case *corev1.Service:
			r.services[v.Name] = v
		}
	}
	var problems []problem
	for _, o := range objects {
		bad := func(format string, args ...any) {
			problems = append(problems, problem{o, fmt.Sprintf(format, args...)})
		}
		switch v := o.value.(type) {
		case *appsv1.Deployment:
			r.podReferences(o, &v.Spec.Template.Spec, bad)
		case *batchv1.Job:
			r.podReferences(o, &v.Spec.Template.Spec, bad)
		case *policyv1.PodDisruptionBudget:
			if !r.selectsPods(v.Spec.Selector) {
				bad("its selector selects no pod of a rendered Deployment")
			}
		case *networkingv1.NetworkPolicy:
			if !r.selectsPods(&v.Spec.PodSelector) {
				bad("its podSelector selects no pod of a rendered Deployment")
			}
		case *corev1.Service:
			if !r.selectsPods(&metav1.LabelSelector{MatchLabels: v.Spec.Selector}) {
				bad("its selector selects no pod of a rendered Deployment")
			}
			r.servicePorts(v, bad)
		case *monitoringv1.ServiceMonitor:
			r.monitorTargets(v, bad)
		case *autoscalingv2.HorizontalPodAutoscaler:
			if ref := v.Spec.ScaleTargetRef; !r.isDeployment(ref.Kind, ref.Name) {
				bad("scaleTargetRef %s/%s is no rendered Deployment", ref.Kind, ref.Name)
			}
		case *kedav1alpha1.ScaledObject:
			if ref := v.Spec.ScaleTargetRef; ref == nil || !r.isDeployment(ref.Kind, ref.Name) {
				bad("scaleTargetRef names no rendered Deployment")
			}
			for _, t := range v.Spec.Triggers {
				if ref := t.AuthenticationRef; ref != nil && ref.Kind != "ClusterTriggerAuthentication" &&
					!r.names["TriggerAuthentication/"+ref.Name] {
					bad("trigger %q: authenticationRef %q is no rendered TriggerAuthentication", t.Name, ref.Name)
				}
			}
		case *kedav1alpha1.TriggerAuthentication:
			for _, ref := range v.Spec.ConfigMapTargetRef {
				r.need(o, "ConfigMap", ref.Name, nil, "configMapTargetRef "+ref.Parameter, bad)
			}
		}
	}
	return problems
}

func isPreInstallHook(o object) bool {
	hook := objectMeta(o.value).Annotations["helm.sh/hook"]
	return strings.Contains(hook, "pre-install")
}

// need: an object o reads must be rendered (or made outside, -external), and a pre-install hook
// may read only what exists before it: other pre-install hooks, or what is made outside.
func (r rendered) need(o object, kind, name string, optional *bool, where string, bad func(string, ...any)) {
	key := kind + "/" + name
	if (optional != nil && *optional) || r.outside[key] {
		return
	}
	if !r.names[key] {
		bad("%s names %s, which is neither rendered nor -external", where, key)
		return
	}
	if isPreInstallHook(o) && !r.hooks[key] {
		bad("%s names %s, which a pre-install hook runs before (it is no hook)", where, key)
	}
}

// podReferences: the ConfigMaps and the service account a pod reads.
func (r rendered) podReferences(o object, spec *corev1.PodSpec, bad func(string, ...any)) {
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		for _, from := range c.EnvFrom {
			if ref := from.ConfigMapRef; ref != nil {
				r.need(o, "ConfigMap", ref.Name, ref.Optional, "container "+c.Name+" envFrom", bad)
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
				ref := e.ValueFrom.ConfigMapKeyRef
				r.need(o, "ConfigMap", ref.Name, ref.Optional, "container "+c.Name+" env "+e.Name, bad)
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil {
			r.need(o, "ConfigMap", v.ConfigMap.Name, v.ConfigMap.Optional, "volume "+v.Name, bad)
		}
	}
	if name := spec.ServiceAccountName; name != "" && name != "default" {
		r.need(o, "ServiceAccount", name, nil, "serviceAccountName", bad)
	}
}

func (r rendered) selectsPods(sel *metav1.LabelSelector) bool {
	selector, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false
	}
	for _, d := range r.deployments {
		if selector.Matches(labelSet(d.Spec.Template.Labels)) {
			return true
		}
	}
	return false
}

func (r rendered) isDeployment(kind, name string) bool {
	return (kind == "" || kind == "Deployment") && r.names["Deployment/"+name]
}

// servicePorts: a named targetPort is a port of the pods the Service selects.
func (r rendered) servicePorts(svc *corev1.Service, bad func(string, ...any)) {
	for _, p := range svc.Spec.Ports {
		if p.TargetPort.StrVal == "" {
			continue
		}
		found := false
		for _, d := range r.deployments {
			if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labelSet(d.Spec.Template.Labels)) {
				continue
			}
			for _, c := range d.Spec.Template.Spec.Containers {
				for _, cp := range c.Ports {
					found = found || cp.Name == p.TargetPort.StrVal
				}
			}
		}
		if !found {
			bad("port %q targets %q, a port no selected pod has", p.Name, p.TargetPort.StrVal)
		}
	}
}

// monitorTargets: a ServiceMonitor selects a rendered Service, scrapes one of its ports by name,
// and takes the job's name from a label that Service has.
func (r rendered) monitorTargets(sm *monitoringv1.ServiceMonitor, bad func(string, ...any)) {
	selector, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		bad("spec.selector: %v", err)
		return
	}
	matched := 0
	for _, svc := range r.services {
		if !selector.Matches(labelSet(svc.Labels)) {
			continue
		}
		matched++
		if _, ok := svc.Labels[sm.Spec.JobLabel]; sm.Spec.JobLabel != "" && !ok {
			bad("jobLabel %q is no label of Service %s (the job would be the Service's name)", sm.Spec.JobLabel, svc.Name)
		}
		for _, ep := range sm.Spec.Endpoints {
			named := false
			for _, p := range svc.Spec.Ports {
				named = named || (ep.Port != "" && p.Name == ep.Port)
			}
			if !named {
				bad("endpoint port %q is no port of Service %s", ep.Port, svc.Name)
			}
		}
	}
	if matched == 0 {
		bad("its selector selects no rendered Service")
	}
}
