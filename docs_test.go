package rdma

import (
	"fmt"
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
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// The docs checked against the code: every identifier, file, make target
// and command flag that the Markdown docs name in code spans, and every
// Type.Member that the package's doc comments name, must exist. A rename
// or a removal then fails here, naming the doc that still says the old
// name, rather than leaving the docs quietly wrong. Further down: the file
// table of docs/architecture.md against the package's files
// (TestDocsFileTable), and the figures the docs quote against the
// benchmarks' results files (TestDocsFiguresMatchResults).

// docFiles are the Markdown docs that are checked.
func docFiles(t *testing.T) []string {
	files := []string{"CHANGELOG.md", "README.md", "CONTRIBUTING.md", "bench/README.md", "bench/history.md"}
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

// The file table of docs/architecture.md names every non-test .go file of
// the package (and no file that does not exist), and each identifier that
// a row of the package's files names in a code span (Name, Type.Member,
// Prefix*) is declared in one of that row's files. A new file therefore
// needs a row, and a declaration that moves to another file takes its
// mention to that file's row.
func TestDocsFileTable(t *testing.T) {
	const doc = "docs/architecture.md"
	b, err := os.ReadFile(doc)
	require.NoError(t, err)
	rows := fileTableRows(t, string(b))
	require.NotEmpty(t, rows, "%s: no file table under \"## Files\"", doc)

	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	decls := map[string]map[string]bool{} // root .go file -> what it declares
	types := map[string]bool{}            // the root package's types, in any file
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		decls[name] = fileDecls(f)
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
				for _, s := range g.Specs {
					types[s.(*ast.TypeSpec).Name.Name] = true
				}
			}
		}
	}

	var wrong []string
	named := map[string]bool{}
	for _, r := range rows {
		rootOnly := true
		for _, f := range r.files {
			if !strings.Contains(f, "/") && strings.HasSuffix(f, ".go") {
				if decls[f] == nil {
					wrong = append(wrong, fmt.Sprintf("%s:%d: a row for %s, which is no source file of the package", doc, r.line, f))
				}
				named[f] = true
				continue
			}
			rootOnly = false
			if _, err := os.Stat(strings.TrimSuffix(f, "/")); err != nil {
				wrong = append(wrong, fmt.Sprintf("%s:%d: a row for %s, which does not exist", doc, r.line, f))
			}
		}
		if !rootOnly {
			continue // directories and commands: their spans are not the package's
		}
		for _, id := range r.idents {
			if !declaredIn(id, r.files, decls, types) {
				wrong = append(wrong, fmt.Sprintf("%s:%d: %s is declared in none of %s", doc, r.line, id, strings.Join(r.files, ", ")))
			}
		}
	}
	for f := range decls {
		if !named[f] {
			wrong = append(wrong, fmt.Sprintf("%s: no row for %s", doc, f))
		}
	}
	sort.Strings(wrong)
	require.Empty(t, wrong, "the file table of %s and the package's files disagree", doc)
}

// fileRow is a row of the file table: its files (the first cell's code
// spans) and the identifiers its second cell names.
type fileRow struct {
	line   int
	files  []string
	idents []string
}

var tableIdent = regexp.MustCompile(`^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?\*?(?:\(\))?$`)

// fileTableRows returns the rows of the table under "## Files".
func fileTableRows(t *testing.T, doc string) []fileRow {
	var rows []fileRow
	in := false
	for i, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "## ") {
			in = line == "## Files"
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.SplitN(strings.Trim(line, "|"), "|", 2)
		require.Len(t, cells, 2, "docs/architecture.md:%d: a row of two cells", i+1)
		r := fileRow{line: i + 1}
		for _, m := range codeSpan.FindAllStringSubmatch(cells[0], -1) {
			r.files = append(r.files, m[1])
		}
		for _, m := range codeSpan.FindAllStringSubmatch(cells[1], -1) {
			if span := m[1]; tableIdent.MatchString(span) && !fileRef.MatchString(span) {
				r.idents = append(r.idents, strings.TrimSuffix(span, "()"))
			}
		}
		rows = append(rows, r)
	}
	return rows
}

// fileDecls returns what a file declares at top level: its functions,
// types, variables and constants by name, its methods by name and as
// Type.Method, and its structs' fields as Type.Field.
func fileDecls(f *ast.File) map[string]bool {
	d := map[string]bool{}
	for _, decl := range f.Decls {
		switch x := decl.(type) {
		case *ast.FuncDecl:
			d[x.Name.Name] = true
			if x.Recv != nil {
				d[recvType(x.Recv.List[0].Type)+"."+x.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range x.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					d[s.Name.Name] = true
					if st, ok := s.Type.(*ast.StructType); ok {
						for _, fld := range st.Fields.List {
							for _, n := range fld.Names {
								d[s.Name.Name+"."+n.Name] = true
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						d[n.Name] = true
					}
				}
			}
		}
	}
	return d
}

// declaredIn reports whether id (Name, Type.Member or Prefix*) is declared
// in one of files. A Type.Member whose Type is no type of the package
// (errors.Is) is another package's, and not checked.
func declaredIn(id string, files []string, decls map[string]map[string]bool, types map[string]bool) bool {
	if typ, _, ok := strings.Cut(id, "."); ok && !types[typ] {
		return true
	}
	prefix, glob := strings.CutSuffix(id, "*")
	for _, f := range files {
		if decls[f][id] {
			return true
		}
		if glob {
			for d := range decls[f] {
				if strings.HasPrefix(d, prefix) {
					return true
				}
			}
		}
	}
	return false
}

// The figures the docs quote from the benchmarks' results files match
// those files. The convention: a figure quoted from a results file sits
// in a paragraph, list item or table row that links that file (a table
// inherits the links of the paragraph just above it), written as the
// file writes it (thousands separators aside); the test finds each such
// figure's text among the numbers of a linked file. A figure is a number
// with a decimal point, a number followed by a unit (×, µs, ms, ns, MB/s,
// req/s, msg/s, conn/s) or by a range's dash and such a number, or a table
// cell that is a number alone. Numbers after ≤, ≥, < or > are goals, and
// code spans are commands: neither is a figure. Figures computed from a
// run that the files do not print (a ratio of two medians) go in units
// that link no results file, and say how they were computed.
// bench/history.md is not checked: it records runs whose results files
// later runs have rewritten.
func TestDocsFiguresMatchResults(t *testing.T) {
	numbers := map[string]map[string]bool{} // results file -> the numbers it holds
	fileNumbers := func(path string) (map[string]bool, error) {
		if n, ok := numbers[path]; ok {
			return n, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		n := map[string]bool{}
		for _, m := range numberRe.FindAllString(string(b), -1) {
			n[strings.ReplaceAll(m, ",", "")] = true
		}
		numbers[path] = n
		return n, nil
	}
	var wrong []string
	checked := 0
	for _, doc := range docFiles(t) {
		if doc == "bench/history.md" {
			continue
		}
		b, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, u := range docUnits(string(b)) {
			if len(u.links) == 0 {
				continue
			}
			var have []map[string]bool
			for _, l := range u.links {
				n, err := fileNumbers(l)
				if err != nil {
					wrong = append(wrong, fmt.Sprintf("%s:%d: links %s, which cannot be read: %v", doc, u.line, l, err))
					continue
				}
				have = append(have, n)
			}
			for _, fig := range unitFigures(u) {
				checked++
				found := false
				for _, n := range have {
					found = found || n[fig]
				}
				if !found && len(have) == len(u.links) {
					wrong = append(wrong, fmt.Sprintf("%s:%d: %s is in none of %s", doc, u.line, fig, strings.Join(u.links, ", ")))
				}
			}
		}
	}
	sort.Strings(wrong)
	require.Empty(t, wrong, "the docs quote figures their results files do not hold")
	require.Greater(t, checked, 100, "the docs quote hardly any figure beside its results file: is the convention still followed?")
}

// docUnit is a paragraph, a list item or a table row of a doc, with the
// results files it links (bench/..., as paths from the root).
type docUnit struct {
	line  int
	text  string
	row   bool // a table row
	links []string
}

var (
	numberRe    = regexp.MustCompile(`(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?`)
	resultsLink = regexp.MustCompile(`\]\((?:\.\./)?(?:bench/)?(results[\w-]*\.(?:md|txt|json))(?:#[^)]*)?\)`)
	linkTarget  = regexp.MustCompile(`\]\([^)]*\)`)
	listItem    = regexp.MustCompile(`^\s*(?:[-*]|\d+\.)\s`)
	figureUnit  = regexp.MustCompile(`^ ?(?:×|x\b|µs|ms|ns|MB/s|req/s|msg/s|conn/s)`)
	rangeNext   = regexp.MustCompile(`^ ?[-–] ?((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)`)
)

// docUnits splits a Markdown doc into its units, fenced code left out.
func docUnits(doc string) []docUnit {
	var units []docUnit
	var cur *docUnit
	var caption []string // the links of the paragraph just above a table
	lastPara, blanks := -1, 0
	flush := func() {
		if cur != nil {
			for _, m := range resultsLink.FindAllStringSubmatch(cur.text, -1) {
				cur.links = append(cur.links, "bench/"+m[1])
			}
			if !cur.row {
				lastPara = -1
				if !listItem.MatchString(cur.text) {
					lastPara = len(units)
				}
			}
			units = append(units, *cur)
			cur = nil
		}
	}
	fenced, inTable := false, false
	for i, line := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			fenced = !fenced
			flush()
			continue
		}
		if fenced {
			continue
		}
		switch {
		case trimmed == "":
			flush()
			inTable = false
			blanks++
		case strings.HasPrefix(trimmed, "#"):
			flush()
			lastPara, inTable = -1, false
		case strings.HasPrefix(trimmed, "|"):
			flush()
			if !inTable {
				caption = nil
				if lastPara >= 0 && lastPara == len(units)-1 && blanks <= 1 {
					caption = units[lastPara].links
				}
				inTable = true
			}
			units = append(units, docUnit{line: i + 1, text: line, row: true})
			u := &units[len(units)-1]
			for _, m := range resultsLink.FindAllStringSubmatch(line, -1) {
				u.links = append(u.links, "bench/"+m[1])
			}
			u.links = append(u.links, caption...)
		default:
			if cur != nil && listItem.MatchString(line) {
				flush()
			}
			if cur == nil {
				cur = &docUnit{line: i + 1}
				blanks = 0
			}
			cur.text += line + "\n"
		}
		if trimmed != "" {
			blanks = 0
		}
	}
	flush()
	return units
}

// unitFigures returns the figures of a unit, thousands separators
// removed.
func unitFigures(u docUnit) []string {
	var figs []string
	add := func(s string) { figs = append(figs, strings.ReplaceAll(s, ",", "")) }
	text := u.text
	if u.row {
		cells := strings.Split(strings.Trim(strings.TrimSpace(text), "|"), "|")
		rest := cells[:0]
		for _, c := range cells {
			c = strings.TrimSpace(c)
			if numberRe.FindString(c) == c && c != "" {
				add(c)
				continue
			}
			rest = append(rest, c)
		}
		text = strings.Join(rest, " | ")
	}
	text = codeSpan.ReplaceAllString(text, " ")
	text = linkTarget.ReplaceAllString(text, "]")
	for _, loc := range numberRe.FindAllStringIndex(text, -1) {
		a, b := loc[0], loc[1]
		if a > 0 {
			prev, _ := utf8.DecodeLastRuneInString(text[:a])
			if unicode.IsLetter(prev) || unicode.IsDigit(prev) || prev == '.' || prev == '_' || prev == '/' || prev == '-' && a > 1 && unicode.IsDigit(rune(text[a-2])) {
				continue // part of a word (p50, IPv6, HTTP/1.1), or a range's second half (taken below)
			}
			before := strings.TrimRight(text[:a], " ")
			if strings.HasSuffix(before, "≤") || strings.HasSuffix(before, "≥") || strings.HasSuffix(before, "<") || strings.HasSuffix(before, ">") {
				continue // a goal
			}
		}
		num, after := text[a:b], text[b:]
		isFig := strings.Contains(num, ".") || figureUnit.MatchString(after)
		if m := rangeNext.FindStringSubmatch(after); m != nil {
			tail := after[len(m[0]):]
			if isFig || strings.Contains(m[1], ".") || figureUnit.MatchString(tail) {
				add(num)
				add(m[1])
			}
			continue
		}
		if isFig {
			add(num)
		}
	}
	return figs
}
