// Command k8s-checker proves rendered Kubernetes manifests without a cluster.
//
//	helm template ... | k8s-checker [-external Kind/name]... [FILE...]
//
// Every document of the YAML stream is decoded strictly into the upstream Go type of its
// apiVersion and kind (k8s.io/api, the Prometheus operator's monitoring API, KEDA's API): a field
// the type does not have, a field given twice, a value of the wrong type or a quantity that does
// not parse is an error, as the API server's strict field validation would answer. A kind the
// checker does not know is an error too, so nothing the chart renders goes unchecked. Then the
// checks the API server (or KEDA's admission webhook) would make that a decode cannot: names and
// labels, selectors that select the pods they are for, references between the objects.
//
// -external names an object the manifests may refer to that is made outside them (a ConfigMap of
// the operator's own, a CA bundle); Secrets are always the operator's own.
//
// It prints one line per object ("ok Kind/name (source)") and one per problem, and exits 1 if
// there was any problem, 2 if the input could not be read.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// object is one decoded document: its kind, where it came from, and the typed value.
type object struct {
	gvk    schema.GroupVersionKind
	name   string
	source string // helm template's "# Source:" comment, or the file and document number
	value  any
}

func (o object) String() string {
	return fmt.Sprintf("%s/%s (%s)", o.gvk.Kind, o.name, o.source)
}

var sourceComment = regexp.MustCompile(`(?m)^# Source: (.+)$`)

// externals is the -external flag: objects made outside the manifests, "Kind/name".
type externals map[string]bool

func (e externals) String() string { return fmt.Sprint(map[string]bool(e)) }
func (e externals) Set(v string) error {
	if !strings.Contains(v, "/") {
		return fmt.Errorf("-external %q: want Kind/name", v)
	}
	e[v] = true
	return nil
}

func main() {
	outside := externals{}
	flag.Var(outside, "external", "an object made outside the manifests, Kind/name (repeatable)")
	flag.Parse()
	inputs := flag.Args()
	var docs []document
	if len(inputs) == 0 {
		read, err := split(os.Stdin, "stdin")
		if err != nil {
			fmt.Fprintf(os.Stderr, "k8s-checker: %v\n", err)
			os.Exit(2)
		}
		docs = read
	}
	for _, path := range inputs {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "k8s-checker: %v\n", err)
			os.Exit(2)
		}
		read, err := split(f, path)
		f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "k8s-checker: %v\n", err)
			os.Exit(2)
		}
		docs = append(docs, read...)
	}
	if len(docs) == 0 {
		fmt.Fprintln(os.Stderr, "k8s-checker: no objects in the input")
		os.Exit(2)
	}
	var objects []object
	problems := 0
	bad := map[string]bool{}
	for _, doc := range docs {
		obj, err := decode(doc)
		if err != nil {
			fmt.Printf("error %s: %v\n", doc.source, err)
			problems++
			continue
		}
		for _, p := range checkObject(obj) {
			fmt.Printf("error %s: %s\n", obj, p)
			problems++
			bad[obj.String()] = true
		}
		objects = append(objects, obj)
	}
	for _, p := range checkLinks(objects, outside) {
		fmt.Printf("error %s: %s\n", p.obj, p.msg)
		problems++
		bad[p.obj.String()] = true
	}
	for _, obj := range objects {
		if !bad[obj.String()] {
			fmt.Printf("ok %s\n", obj)
		}
	}
	fmt.Printf("%d objects, %d problems\n", len(objects), problems)
	if problems > 0 {
		os.Exit(1)
	}
}

// document is one YAML document of the input and where it came from.
type document struct {
	source string
	body   []byte
}

// split cuts a YAML stream into its documents, leaving out the empty ones (helm template writes
// a document of comments alone for a template that rendered nothing).
func split(r io.Reader, name string) ([]document, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var docs []document
	for n := 1; ; n++ {
		body, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, n, err)
		}
		if len(bytes.TrimSpace(stripComments(body))) == 0 {
			continue
		}
		source := fmt.Sprintf("%s#%d", name, n)
		if m := sourceComment.FindSubmatch(body); m != nil {
			source = string(m[1])
		}
		docs = append(docs, document{source: source, body: body})
	}
}

func stripComments(body []byte) []byte {
	var kept [][]byte
	for _, line := range bytes.Split(body, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			kept = append(kept, line)
		}
	}
	return bytes.Join(kept, []byte("\n"))
}

// decode reads a document's kind, then decodes it strictly into that kind's Go type.
func decode(doc document) (object, error) {
	data, err := yaml.YAMLToJSONStrict(doc.body) // a key given twice is an error
	if err != nil {
		return object{}, fmt.Errorf("not YAML the API server accepts: %w", err)
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &head); err != nil {
		return object{}, fmt.Errorf("no object: %w", err)
	}
	gv, err := schema.ParseGroupVersion(head.APIVersion)
	if err != nil {
		return object{}, fmt.Errorf("apiVersion %q: %w", head.APIVersion, err)
	}
	gvk := gv.WithKind(head.Kind)
	make, known := kinds[gvk]
	if !known {
		return object{}, fmt.Errorf("%s %s/%s: a kind this checker does not know (add its upstream type to kinds.go)",
			head.Kind, head.APIVersion, head.Metadata.Name)
	}
	value := make()
	// sigs.k8s.io/json is the API server's own decoder: field names match case-sensitively, and
	// the strict errors are the unknown and duplicate fields that strict field validation refuses.
	strict, err := sigsjson.UnmarshalStrict(data, value)
	if err != nil {
		return object{}, fmt.Errorf("%s/%s: %w", head.Kind, head.Metadata.Name, err)
	}
	if len(strict) > 0 {
		var msgs []string
		for _, e := range strict {
			msgs = append(msgs, e.Error())
		}
		return object{}, fmt.Errorf("%s/%s: %s", head.Kind, head.Metadata.Name, strings.Join(msgs, "; "))
	}
	return object{gvk: gvk, name: head.Metadata.Name, source: doc.source, value: value}, nil
}
