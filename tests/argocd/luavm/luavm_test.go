// Package luavm runs kubedgx's Argo CD health checks and resource actions in Argo CD's own Lua VM: the package
// github.com/argoproj/argo-cd/v3/util/lua, imported as a module at the version go.mod pins, not an imitation of it.
//
// Argo CD v3.2.12: the newest release whose module graph builds from the Go module proxy with Go 1.26 (v3.3 to v3.5
// replace their gitops-engine with a directory of their own repository, which their module zip leaves out: the
// version v3.3 names in its place lacks KubectlCmd.ManageServerSideDiffDryRuns, which v3.3 calls, and the one v3.4
// and v3.5 name is not served; v3.6 needs Go 1.27). util/lua's lua.go and
// oslib_safe.go are the same in v3.2.12 to v3.5.7 but for gitops-engine's import path and one reflect call; v3.6.1
// adds a compiled-script cache and returns no health for a script that returns nil. So the VM (which libraries
// open, the safe os module, the JSON in and out, the one-second timeout) is the one Argo CD 3.2 to 3.6 run; gopher-lua
// itself moved from v1.1.1 to v1.1.2 in Argo CD 3.5, and lua-v1.1.2.mod builds this test with that one.
//
// The directory it reads is laid out as Argo CD's resource_customizations/ (<group>/<Kind>/health.lua with
// health_test.yaml and testdata/, <group>/<Kind>/actions/ with discovery.lua, <action>/action.lua and
// action_test.yaml), so two of the tests below are Argo CD's own TestLuaHealthScript and
// TestLuaResourceActionsScript (util/lua/health_test.go and util/lua/custom_actions_test.go of Argo CD v3.2.12),
// copied with these differences:
//
//   - the scripts reach the VM as resource overrides (what argocd-cm holds) rather than from Argo CD's embedded
//     resource_customizations/, which kubedgx's are not compiled into; VM.GetHealthScript,
//     GetResourceActionDiscovery and GetResourceAction consult the overrides first, so the same lookup code runs;
//   - stricter, so that they cannot pass by checking nothing: a discovery test must find exactly the expected
//     actions (Argo CD's only checks that each one found was expected, which a script offering nothing passes), a
//     test file with an unknown key or no case fails, and so does a directory with no health.lua;
//   - a failed action test logs both objects as YAML instead of calling Argo CD's util/cli.PrintDiff (an external
//     diff program; it judges nothing).
//
// The third test, TestArgoCDConfigMap, is the installed path: the argocd-cm data (the chart's ConfigMap, rendered by
// tests/argocd/test_lua_vm.py, in $KUBEDGX_ARGOCD_CM) parsed into overrides as Argo CD's settings manager parses
// argocd-cm, health through gitops-engine's health.GetResourceHealth with lua.ResourceHealthOverrides (what the
// application controller calls), actions as the API server runs them (no open libraries) and the merge patch the
// API server would send.
package luavm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/argoproj/gitops-engine/pkg/diff"
	"github.com/argoproj/gitops-engine/pkg/health"
	jsonpatch "github.com/evanphx/json-patch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	appsv1 "github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/lua"
)

const (
	// envRoot names the resource_customizations directory; the default is the chart's, seen from this directory.
	envRoot     = "KUBEDGX_ARGOCD_CUSTOMIZATIONS"
	defaultRoot = "../../../charts/kubedgx/files/argocd/resource_customizations"
	// envConfigMap names a YAML or JSON file holding the data of a ConfigMap to merge into argocd-cm (the chart's
	// ConfigMap, or the patch docs/argocd.md's jq command writes). Without it, TestArgoCDConfigMap writes that data
	// from the directory itself.
	envConfigMap = "KUBEDGX_ARGOCD_CM"
)

func customizationsRoot(t *testing.T) string {
	t.Helper()
	root := os.Getenv(envRoot)
	if root == "" {
		root = defaultRoot
	}
	info, err := os.Stat(root)
	require.NoError(t, err, "the resource_customizations directory (%s)", envRoot)
	require.True(t, info.IsDir(), root)
	return filepath.Clean(root)
}

// A Kind's scripts, read from <root>/<group>/<Kind>/ as Argo CD's getPredefinedLuaScripts reads its embedded ones.
type customization struct {
	key       string // "<group>/<Kind>", lua.GetConfigMapKey's form
	health    string
	discovery string
	actions   map[string]string // action name -> action.lua
}

func readCustomizations(t *testing.T, root string) map[string]customization {
	t.Helper()
	out := map[string]customization{}
	err := filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.IsDir() || info.Name() != "health.lua" {
			return nil
		}
		dir := filepath.Dir(path)
		key := filepath.ToSlash(strings.TrimPrefix(dir, root+string(filepath.Separator)))
		c := customization{key: key, health: readFile(t, path), actions: map[string]string{}}
		if b, err := os.ReadFile(filepath.Join(dir, "actions", "discovery.lua")); err == nil {
			c.discovery = string(b)
			names, err := filepath.Glob(filepath.Join(dir, "actions", "*", "action.lua"))
			require.NoError(t, err)
			for _, name := range names {
				c.actions[filepath.Base(filepath.Dir(name))] = readFile(t, name)
			}
		}
		out[key] = c
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, out, "no <group>/<Kind>/health.lua under %s", root)
	return out
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// actionsValue is the value of an argocd-cm key resource.customizations.actions.<group>_<Kind>: the YAML form of
// appv1.ResourceActions, which ResourceOverride.GetActions parses.
func (c customization) actionsValue(t *testing.T) string {
	t.Helper()
	if c.discovery == "" {
		return ""
	}
	actions := appsv1.ResourceActions{ActionDiscoveryLua: c.discovery}
	names := make([]string, 0, len(c.actions))
	for name := range c.actions {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		actions.Definitions = append(actions.Definitions, appsv1.ResourceActionDefinition{Name: name, ActionLua: c.actions[name]})
	}
	b, err := yaml.Marshal(actions)
	require.NoError(t, err)
	return string(b)
}

// builtIn holds the scripts where Argo CD's VM looks first, for the tests that stand in for Argo CD's own.
func builtIn(t *testing.T, root string) map[string]appsv1.ResourceOverride {
	t.Helper()
	overrides := map[string]appsv1.ResourceOverride{}
	for key, c := range readCustomizations(t, root) {
		overrides[key] = appsv1.ResourceOverride{HealthLua: c.health, Actions: c.actionsValue(t)}
	}
	return overrides
}

// ---------------------------------------------------------------------------------------------------------------
// Argo CD's TestLuaHealthScript and TestLuaResourceActionsScript (util/lua, v3.2.12), on kubedgx's directory.
// ---------------------------------------------------------------------------------------------------------------

type TestStructure struct {
	Tests []IndividualTest `yaml:"tests"`
}

type IndividualTest struct {
	InputPath    string              `yaml:"inputPath"`
	HealthStatus health.HealthStatus `yaml:"healthStatus"`
}

func getObj(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	yamlBytes, err := os.ReadFile(path)
	require.NoError(t, err)
	obj := make(map[string]any)
	err = yaml.Unmarshal(yamlBytes, &obj)
	require.NoError(t, err)

	return &unstructured.Unstructured{Object: obj}
}

func healthTests(t *testing.T, root string, run func(dir string, test IndividualTest)) {
	t.Helper()
	err := filepath.Walk(root, func(path string, _ os.FileInfo, err error) error {
		if !strings.Contains(path, "health.lua") {
			return nil
		}
		require.NoError(t, err)
		dir := filepath.Dir(path)
		yamlBytes, err := os.ReadFile(dir + "/health_test.yaml")
		require.NoError(t, err)
		var resourceTest TestStructure
		err = yaml.UnmarshalStrict(yamlBytes, &resourceTest)
		require.NoError(t, err)
		require.NotEmpty(t, resourceTest.Tests, "%s/health_test.yaml has no tests", dir)
		for i := range resourceTest.Tests {
			run(dir, resourceTest.Tests[i])
		}
		return nil
	})
	assert.NoError(t, err)
}

func TestLuaHealthScript(t *testing.T) {
	root := customizationsRoot(t)
	overrides := builtIn(t, root)
	healthTests(t, root, func(dir string, test IndividualTest) {
		t.Run(filepath.Join(strings.TrimPrefix(dir, root+"/"), test.InputPath), func(t *testing.T) {
			vm := lua.VM{
				UseOpenLibs:       true,
				ResourceOverrides: overrides,
			}
			obj := getObj(t, filepath.Join(dir, test.InputPath))
			script, _, err := vm.GetHealthScript(obj)
			require.NoError(t, err)
			require.NotEmpty(t, script, "no health check for %s", lua.GetConfigMapKey(obj.GroupVersionKind()))
			result, err := vm.ExecuteHealthLua(obj, script)
			require.NoError(t, err)
			assert.Equal(t, &test.HealthStatus, result)
		})
	})
}

type ActionTestStructure struct {
	DiscoveryTests []IndividualDiscoveryTest `yaml:"discoveryTests"`
	ActionTests    []IndividualActionTest    `yaml:"actionTests"`
}

type IndividualDiscoveryTest struct {
	InputPath string                  `yaml:"inputPath"`
	Result    []appsv1.ResourceAction `yaml:"result"`
}

type IndividualActionTest struct {
	Action               string            `yaml:"action"`
	InputPath            string            `yaml:"inputPath"`
	ExpectedOutputPath   string            `yaml:"expectedOutputPath"`
	ExpectedErrorMessage string            `yaml:"expectedErrorMessage"`
	InputStr             string            `yaml:"input"`
	Parameters           map[string]string `yaml:"parameters"`
}

func actionTests(t *testing.T, root string, run func(dir string, tests ActionTestStructure)) {
	t.Helper()
	err := filepath.Walk(root, func(path string, _ os.FileInfo, err error) error {
		if !strings.Contains(path, "action_test.yaml") {
			return nil
		}
		require.NoError(t, err)
		dir := filepath.Dir(path)
		yamlBytes, err := os.ReadFile(filepath.Join(dir, "action_test.yaml"))
		require.NoError(t, err)
		var resourceTest ActionTestStructure
		err = yaml.UnmarshalStrict(yamlBytes, &resourceTest)
		require.NoError(t, err)
		require.NotEmpty(t, resourceTest.DiscoveryTests, "%s/action_test.yaml has no discoveryTests", dir)
		require.NotEmpty(t, resourceTest.ActionTests, "%s/action_test.yaml has no actionTests", dir)
		run(dir, resourceTest)
		return nil
	})
	require.NoError(t, err)
}

func TestLuaResourceActionsScript(t *testing.T) {
	root := customizationsRoot(t)
	overrides := builtIn(t, root)
	actionTests(t, root, func(dir string, resourceTest ActionTestStructure) {
		for i := range resourceTest.DiscoveryTests {
			test := resourceTest.DiscoveryTests[i]
			testName := "discovery/" + test.InputPath
			t.Run(testName, func(t *testing.T) {
				vm := lua.VM{
					UseOpenLibs:       true,
					ResourceOverrides: overrides,
				}
				obj := getObj(t, filepath.Join(dir, test.InputPath))
				discoveryLua, err := vm.GetResourceActionDiscovery(obj)
				require.NoError(t, err)
				result, err := vm.ExecuteResourceActionDiscovery(obj, discoveryLua)
				require.NoError(t, err)
				for i := range result {
					assert.Contains(t, test.Result, result[i])
				}
				assert.ElementsMatch(t, test.Result, result) // kubedgx's: nothing expected is missing either
			})
		}
		for i := range resourceTest.ActionTests {
			test := resourceTest.ActionTests[i]
			testName := fmt.Sprintf("actions/%s/%s", test.Action, test.InputPath)
			t.Run(testName, func(t *testing.T) {
				// As Argo CD's test: no open libraries, the privileges the API server runs actions with.
				vm := lua.VM{ResourceOverrides: overrides}
				runActionTest(t, vm, dir, test)
			})
		}
	})
}

// runActionTest is the body of Argo CD's action test case; it returns the source object and what the action made
// of it for the caller's further checks (nil when an error was expected).
func runActionTest(t *testing.T, vm lua.VM, dir string, test IndividualActionTest) (*unstructured.Unstructured, []lua.ImpactedResource) {
	t.Helper()
	sourceObj := getObj(t, filepath.Join(dir, test.InputPath))
	action, err := vm.GetResourceAction(sourceObj, test.Action)
	require.NoError(t, err)
	require.NotEmpty(t, action.ActionLua, "no action %q", test.Action)

	require.Empty(t, test.Parameters, "kubedgx's actions take no parameters")
	impactedResources, err := vm.ExecuteResourceAction(sourceObj, action.ActionLua, nil)

	if test.ExpectedErrorMessage != "" {
		assert.EqualError(t, err, test.ExpectedErrorMessage)
		return sourceObj, nil
	}
	require.NoError(t, err)
	require.NotEmpty(t, impactedResources)

	expectedObjects := getExpectedObjectList(t, filepath.Join(dir, test.ExpectedOutputPath))
	for _, impactedResource := range impactedResources {
		result := impactedResource.UnstructuredObj
		expectedObj := findFirstMatchingItem(expectedObjects.Items, func(u unstructured.Unstructured) bool {
			return u.GroupVersionKind() == result.GroupVersionKind() && u.GetName() == result.GetName() && u.GetNamespace() == result.GetNamespace()
		})
		require.NotNil(t, expectedObj, "%s/%s is in no expected output", result.GetKind(), result.GetName())

		switch impactedResource.K8SOperation {
		case lua.PatchOperation:
			// Patching is only allowed for the source resource.
			assert.Equal(t, sourceObj.GroupVersionKind(), result.GroupVersionKind())
			assert.Equal(t, sourceObj.GetName(), result.GetName())
			assert.Equal(t, sourceObj.GetNamespace(), result.GetNamespace())
		case lua.CreateOperation:
			t.Errorf("kubedgx's actions create nothing, %s made %s/%s", test.Action, result.GetKind(), result.GetName())
		}

		// As Argo CD's test: the Lua VM returns float64 where the input had integers, so gitops-engine's diff
		// compares, not assert.Equal.
		diffResult, err := diff.Diff(expectedObj, result, diff.WithNormalizer(noNormalizer{}))
		require.NoError(t, err)
		if diffResult.Modified {
			want, _ := yaml.Marshal(expectedObj.Object)
			got, _ := yaml.Marshal(result.Object)
			t.Errorf("Output does not match the expected output:\n--- expected\n%s\n--- got\n%s", want, got)
		}
	}
	return sourceObj, impactedResources
}

type noNormalizer struct{}

func (noNormalizer) Normalize(*unstructured.Unstructured) error { return nil }

// getExpectedObjectList is Argo CD's: an old-style action's expected output is one object, a new-style one's a list.
func getExpectedObjectList(t *testing.T, path string) *unstructured.UnstructuredList {
	t.Helper()
	yamlBytes, err := os.ReadFile(path)
	require.NoError(t, err)
	unstructuredList := &unstructured.UnstructuredList{}
	if len(yamlBytes) > 0 && yamlBytes[0] == '-' {
		objList := make([]map[string]any, 5)
		err = yaml.Unmarshal(yamlBytes, &objList)
		require.NoError(t, err)
		unstructuredList.Items = make([]unstructured.Unstructured, len(objList))
		for i, obj := range objList {
			unstructuredObj, ok := obj["unstructuredObj"].(map[string]any)
			assert.True(t, ok, "Wrong type of unstructuredObj")
			unstructuredList.Items[i] = unstructured.Unstructured{Object: unstructuredObj}
		}
	} else {
		obj := make(map[string]any)
		err = yaml.Unmarshal(yamlBytes, &obj)
		require.NoError(t, err)
		unstructuredList.Items = []unstructured.Unstructured{{Object: obj}}
	}
	return unstructuredList
}

func findFirstMatchingItem(items []unstructured.Unstructured, f func(unstructured.Unstructured) bool) *unstructured.Unstructured {
	for i := range items {
		if f(items[i]) {
			return &items[i]
		}
	}
	return nil
}

// ---------------------------------------------------------------------------------------------------------------
// The installed path: argocd-cm's keys, parsed as Argo CD parses them, run as the controller and API server run them.
// ---------------------------------------------------------------------------------------------------------------

const customizationsKey = "resource.customizations"

// configMapData is $KUBEDGX_ARGOCD_CM's data map, or else argocd-cm data written from the directory.
func configMapData(t *testing.T, root string) map[string]string {
	t.Helper()
	path := os.Getenv(envConfigMap)
	if path == "" {
		data := map[string]string{}
		for key, c := range readCustomizations(t, root) {
			groupKind := strings.Replace(key, "/", "_", 1)
			data[customizationsKey+".health."+groupKind] = c.health
			if v := c.actionsValue(t); v != "" {
				data[customizationsKey+".actions."+groupKind] = v
			}
		}
		return data
	}
	// A ConfigMap, or a merge patch of one ({"data": {...}}), or the data alone.
	var doc struct {
		Data map[string]string `json:"data"`
	}
	raw := readFile(t, path)
	if err := yaml.Unmarshal([]byte(raw), &doc); err != nil || len(doc.Data) == 0 {
		require.NoError(t, yaml.Unmarshal([]byte(raw), &doc.Data), "%s is no ConfigMap and no data map", path)
	}
	require.NotEmpty(t, doc.Data, "%s holds no ConfigMap data", path)
	return doc.Data
}

// resourceOverrides parses argocd-cm's split keys resource.customizations.<type>.<group>_<Kind> into resource
// overrides: SettingsManager.appendResourceOverridesFromSplitKeys and convertToOverrideKey of Argo CD v3.2.12
// (util/settings/settings.go, lines 1060-1138), unexported there, restricted to the types that carry Lua.
// (SettingsManager.GetResourceOverrides itself needs a Kubernetes client and Argo CD's whole settings package.)
func resourceOverrides(t *testing.T, cmData map[string]string) map[string]appsv1.ResourceOverride {
	t.Helper()
	resourceOverrides := map[string]appsv1.ResourceOverride{}
	for k, v := range cmData {
		if !strings.HasPrefix(k, customizationsKey) {
			continue
		}
		parts := strings.SplitN(k, ".", 4)
		if len(parts) < 4 {
			continue
		}
		groupKind := strings.Split(parts[3], "_")
		overrideKey := parts[3]
		switch {
		case len(groupKind) == 2:
			overrideKey = groupKind[0] + "/" + groupKind[1]
		case len(groupKind) == 1 && parts[3] != "":
		default:
			t.Fatalf("%s: group kind should be in format `resource.customizations.<type>.<group_kind>`", k)
		}
		overrideVal := resourceOverrides[overrideKey]
		switch parts[2] {
		case "health":
			overrideVal.HealthLua = v
		case "useOpenLibs":
			useOpenLibs, err := strconv.ParseBool(v)
			require.NoError(t, err, k)
			overrideVal.UseOpenLibs = useOpenLibs
		case "actions":
			overrideVal.Actions = v
		default:
			t.Fatalf("%s: a kubedgx ConfigMap holds only health, useOpenLibs and actions keys", k)
		}
		resourceOverrides[overrideKey] = overrideVal
	}
	return resourceOverrides
}

func TestArgoCDConfigMap(t *testing.T) {
	root := customizationsRoot(t)
	overrides := resourceOverrides(t, configMapData(t, root))

	// Every Kind's scripts are there, verbatim, under the keys Argo CD reads; nothing asks for the open libraries.
	t.Run("keys", func(t *testing.T) {
		customizations := readCustomizations(t, root)
		keys := make([]string, 0, len(customizations))
		for key, c := range customizations {
			keys = append(keys, key)
			override := overrides[key]
			assert.Equal(t, strings.TrimRight(c.health, "\n"), strings.TrimRight(override.HealthLua, "\n"), "%s health", key)
			assert.False(t, override.UseOpenLibs, "%s needs no open libraries", key)
			if c.discovery == "" {
				assert.Empty(t, override.Actions, "%s has no actions/", key)
				continue
			}
			actions, err := override.GetActions()
			require.NoError(t, err, "%s actions", key)
			assert.False(t, actions.MergeBuiltinActions)
			assert.Equal(t, strings.TrimRight(c.discovery, "\n"), strings.TrimRight(actions.ActionDiscoveryLua, "\n"), "%s discovery", key)
			got := map[string]string{}
			for _, d := range actions.Definitions {
				got[d.Name] = strings.TrimRight(d.ActionLua, "\n")
			}
			want := map[string]string{}
			for name, script := range c.actions {
				want[name] = strings.TrimRight(script, "\n")
			}
			assert.Equal(t, want, got, "%s action definitions", key)
		}
		var extra []string
		for key := range overrides {
			if _, ok := customizations[key]; !ok {
				extra = append(extra, key)
			}
		}
		assert.Empty(t, extra, "overrides for kinds with no resource_customizations directory")
		assert.NotEmpty(t, keys)
	})

	healthTests(t, root, func(dir string, test IndividualTest) {
		t.Run(filepath.Join("health", strings.TrimPrefix(dir, root+"/"), test.InputPath), func(t *testing.T) {
			obj := getObj(t, filepath.Join(dir, test.InputPath))
			// The application controller's call (controller/health.go): the script runs without the open libraries
			// unless argocd-cm sets useOpenLibs for the kind.
			result, err := health.GetResourceHealth(obj, lua.ResourceHealthOverrides(overrides))
			require.NoError(t, err)
			assert.Equal(t, &test.HealthStatus, result)
		})
	})

	actionTests(t, root, func(dir string, resourceTest ActionTestStructure) {
		// The API server's VM (server/application/application.go): overrides only, no open libraries.
		vm := lua.VM{ResourceOverrides: overrides}
		for i := range resourceTest.DiscoveryTests {
			test := resourceTest.DiscoveryTests[i]
			t.Run("discovery/"+test.InputPath, func(t *testing.T) {
				obj := getObj(t, filepath.Join(dir, test.InputPath))
				scripts, err := vm.GetResourceActionDiscovery(obj)
				require.NoError(t, err)
				require.Len(t, scripts, 1)
				result, err := vm.ExecuteResourceActionDiscovery(obj, scripts)
				require.NoError(t, err)
				assert.ElementsMatch(t, test.Result, result)
			})
		}
		for i := range resourceTest.ActionTests {
			test := resourceTest.ActionTests[i]
			t.Run(fmt.Sprintf("actions/%s/%s", test.Action, test.InputPath), func(t *testing.T) {
				sourceObj, impacted := runActionTest(t, vm, dir, test)
				// The merge patch the API server sends (Server.patchResource): an action changes the spec only,
				// never the status the operator writes or the metadata.
				live, err := json.Marshal(sourceObj)
				require.NoError(t, err)
				for _, r := range impacted {
					changed, err := json.Marshal(r.UnstructuredObj)
					require.NoError(t, err)
					patch, err := jsonpatch.CreateMergePatch(live, changed)
					require.NoError(t, err)
					var fields map[string]any
					require.NoError(t, json.Unmarshal(patch, &fields))
					assert.NotEmpty(t, fields, "%s changes nothing", test.Action)
					for field := range fields {
						assert.Equal(t, "spec", field, "%s patches %s: %s", test.Action, field, patch)
					}
				}
			})
		}
	})
}
