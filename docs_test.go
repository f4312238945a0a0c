package rdma

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The docs checked against the code: every identifier, file, make target
// and command flag that the Markdown docs name in code spans, and every
// Type.Member that the package's doc comments name, must exist. A rename
// or a removal then fails here, naming the doc that still says the old
// name, rather than leaving the docs quietly wrong.

// docFiles are the Markdown docs that are checked.
func docFiles(t *testing.T) []string {
	files := []string{"README.md", "CONTRIBUTING.md", "bench/README.md"}
	more, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	return append(files, more...)
}

// codeFacts is what the tree declares.
type codeFacts struct {
	files    map[string]bool            // every file, by path from the root and by base name
	names    map[string]bool            // every identifier declared at top level, in any package
	root     map[string]bool            // the root package's top-level identifiers
	members  map[string]map[string]bool // the root package's types: their methods and fields
	embeds   map[string][]string        // the root package's types: the types they embed
	flags    map[string]map[string]bool // each command's flags
	targets  map[string]bool            // the Makefile's targets
	docDecls []*ast.CommentGroup        // the doc comments of the root package's exported declarations
	docNames []string                   // ... and what they document, for messages
	docOwn   []map[string]bool          // ... and the names of their parameters and results
}

var flagCall = regexp.MustCompile(`\.(?:String|Int|Int64|Uint|Uint64|Bool|Duration|Float64|Func|Text|BoolFunc)?(?:Var)?\(\s*(?:[^,"()]+(?:\([^()]*\))?,\s*)?"([\w-]+)"`)

func readFacts(t *testing.T) *codeFacts {
	f := &codeFacts{files: map[string]bool{}, names: map[string]bool{}, root: map[string]bool{},
		members: map[string]map[string]bool{}, embeds: map[string][]string{}, flags: map[string]map[string]bool{}, targets: map[string]bool{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		f.files[path] = true
		f.files[d.Name()] = true
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		if strings.HasPrefix(dir, "cmd"+string(filepath.Separator)) {
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			cmd := filepath.Base(dir)
			if f.flags[cmd] == nil {
				f.flags[cmd] = map[string]bool{}
			}
			for _, m := range flagCall.FindAllStringSubmatch(string(src), -1) {
				f.flags[cmd][m[1]] = true
			}
		}
		f.declare(file, dir == ".", strings.HasSuffix(path, "_test.go"))
		return nil
	})
	require.NoError(t, err)
	mk, err := os.ReadFile("Makefile")
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`(?m)^([a-z][\w-]*):`).FindAllStringSubmatch(string(mk), -1) {
		f.targets[m[1]] = true
	}
	return f
}

// declare records a file's declarations; root says it is of the root
// package, test that it is a test file.
func (f *codeFacts) declare(file *ast.File, root, test bool) {
	name := func(n string) {
		f.names[n] = true
		if root {
			f.root[n] = true
		}
	}
	member := func(typ, m string) {
		f.names[m] = true
		if !root {
			return
		}
		if f.members[typ] == nil {
			f.members[typ] = map[string]bool{}
		}
		f.members[typ][m] = true
	}
	for _, decl := range file.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				name(d.Name.Name)
			} else {
				member(recvType(d.Recv.List[0].Type), d.Name.Name)
			}
			if root && !test && d.Name.IsExported() && d.Doc != nil {
				own := map[string]bool{}
				for _, fl := range []*ast.FieldList{d.Type.Params, d.Type.Results} {
					if fl == nil {
						continue
					}
					for _, p := range fl.List {
						for _, n := range p.Names {
							own[n.Name] = true
						}
					}
				}
				f.docDecls = append(f.docDecls, d.Doc)
				f.docNames = append(f.docNames, d.Name.Name)
				f.docOwn = append(f.docOwn, own)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					name(s.Name.Name)
					if st, ok := s.Type.(*ast.StructType); ok {
						for _, fld := range st.Fields.List {
							if len(fld.Names) == 0 {
								emb := recvType(fld.Type)
								member(s.Name.Name, emb)
								f.embeds[s.Name.Name] = append(f.embeds[s.Name.Name], emb)
							}
							for _, n := range fld.Names {
								member(s.Name.Name, n.Name)
							}
						}
					}
					if root && !test && s.Name.IsExported() {
						doc := s.Doc
						if doc == nil && len(d.Specs) == 1 {
							doc = d.Doc
						}
						if doc != nil {
							f.docDecls = append(f.docDecls, doc)
							f.docNames = append(f.docNames, s.Name.Name)
							f.docOwn = append(f.docOwn, nil)
						}
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						name(n.Name)
					}
				}
			}
		}
	}
}

func recvType(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return recvType(x.X)
	case *ast.IndexExpr:
		return recvType(x.X)
	case *ast.IndexListExpr:
		return recvType(x.X)
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.Ident:
		return x.Name
	}
	return ""
}

// hasMember reports whether a root type has a method or field m, its own
// or promoted from a type it embeds.
func (f *codeFacts) hasMember(typ, m string) bool {
	if f.members[typ][m] {
		return true
	}
	for _, e := range f.embeds[typ] {
		if e != typ && f.hasMember(e, m) {
			return true
		}
	}
	return false
}

// foreign are names in the docs' code spans that are not this project's:
// settings, types and functions of the system and of other libraries that
// a span names without their package.
var foreign = map[string]bool{
	"LimitMEMLOCK": true, // systemd
	"GOMAXPROCS":   true,
	"TryLock":      true, // sync.Mutex's
}

var (
	codeSpan  = regexp.MustCompile("`([^`\n]+)`")
	fileRef   = regexp.MustCompile(`^[\w./-]+\.(go|sh|c|md|json)$`)
	identRef  = regexp.MustCompile(`^(rdma\.)?([A-Z]\w*)(?:\.([A-Z]\w*))?(?:\(\))?$`)
	memberRef = regexp.MustCompile(`\b([A-Z]\w*)\.([A-Z]\w*)\b`)
	allCaps   = regexp.MustCompile(`^[A-Z0-9_]+$`)
)

// checkSpan returns what is wrong with a code span of doc, or "".
func (f *codeFacts) checkSpan(doc, span string) string {
	span = strings.TrimSpace(span)
	if fileRef.MatchString(span) && !strings.Contains(span, "*") {
		if f.files[span] || f.files[filepath.Join(filepath.Dir(doc), span)] || f.files[filepath.Base(span)] && !strings.Contains(span, "/") {
			return ""
		}
		return "no file " + span
	}
	if fields := strings.Fields(span); len(fields) >= 2 && fields[0] == "make" {
		for _, tgt := range fields[1:] {
			if strings.Contains(tgt, "=") {
				continue
			}
			if !f.targets[tgt] {
				return "no make target " + tgt
			}
		}
		return ""
	}
	if fields := strings.Fields(span); len(fields) >= 2 && f.flags[fields[0]] != nil {
		for _, a := range fields[1:] {
			if !strings.HasPrefix(a, "-") || a == "-" {
				continue
			}
			fl := strings.TrimLeft(a, "-")
			fl, _, _ = strings.Cut(fl, "=")
			if fl != "" && !f.flags[fields[0]][fl] {
				return "no flag -" + fl + " of " + fields[0]
			}
		}
		return ""
	}
	m := identRef.FindStringSubmatch(span)
	if m == nil || allCaps.MatchString(m[2]) || foreign[m[2]] {
		return ""
	}
	qualified, typ, mem := m[1] != "", m[2], m[3]
	if mem != "" {
		if f.members[typ] == nil && !f.root[typ] {
			if qualified {
				return "no rdma." + typ
			}
			return "" // another package's type
		}
		if !f.hasMember(typ, mem) {
			return "no " + typ + "." + mem
		}
		return ""
	}
	if qualified && !f.root[typ] {
		return "no rdma." + typ
	}
	if !f.names[typ] {
		return "no identifier " + typ
	}
	return ""
}

func TestDocsNameRealThings(t *testing.T) {
	f := readFacts(t)
	var wrong []string
	for _, doc := range docFiles(t) {
		b, err := os.ReadFile(doc)
		require.NoError(t, err)
		fenced := false
		for i, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
				continue
			}
			if fenced {
				continue
			}
			for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
				if w := f.checkSpan(doc, m[1]); w != "" {
					wrong = append(wrong, doc+":"+strconv.Itoa(i+1)+": "+w)
				}
			}
		}
	}
	// The package's doc comments: a Type.Member they name must exist.
	for i, cg := range f.docDecls {
		for _, m := range memberRef.FindAllStringSubmatch(cg.Text(), -1) {
			if (f.members[m[1]] != nil || f.root[m[1]]) && !f.hasMember(m[1], m[2]) {
				wrong = append(wrong, "the doc of "+f.docNames[i]+": no "+m[1]+"."+m[2])
			}
		}
	}
	sort.Strings(wrong)
	require.Empty(t, wrong, "the docs name things the code does not have")
}

// The public API's docs are for its users: they name no file of the
// package and none of its unexported identifiers (those whose names are
// not also words: tryPoll, readMu), which belong in comments for its
// maintainers.
func TestDocsForUsers(t *testing.T) {
	f := readFacts(t)
	camel := regexp.MustCompile(`^[a-z]+[A-Z]\w*$`)
	internal := map[string]bool{}
	for n := range f.root {
		if camel.MatchString(n) {
			internal[n] = true
		}
	}
	for _, ms := range f.members {
		for n := range ms {
			if camel.MatchString(n) {
				internal[n] = true
			}
		}
	}
	word := regexp.MustCompile(`[A-Za-z_][\w]*(?:\.go\b)?`)
	var wrong []string
	for i, cg := range f.docDecls {
		for _, w := range word.FindAllString(cg.Text(), -1) {
			if strings.HasSuffix(w, ".go") || internal[w] && !f.docOwn[i][w] {
				wrong = append(wrong, "the doc of "+f.docNames[i]+" names "+w)
			}
		}
	}
	sort.Strings(wrong)
	require.Empty(t, wrong)
}
