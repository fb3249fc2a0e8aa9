"""Hand mutation testing (in process) of a small module against test functions (issue 49).

PYTHONPATH=. python tools/hand_mutation.py MODULE_PATH MODULE_NAME TEST_MODULE [TEST_MODULE ...]

Faster than mutmut on a loaded machine (no process per mutant): each mutant is the module's
AST with one change, executed as a fresh module object and patched into every fl_privacy
module and test module that imported the original; the test functions without fixtures are
then called in process. LINES="a-b,c-d" limits the mutants to those line ranges,
SKIP_TESTS="word,..." skips test functions whose names hold a word.
Mutants: each comparison operator flipped (< <=, > >=, == !=), each arithmetic operator
swapped (+ -, * /, // /), each numeric constant c -> c + 1 and c -> 0 (0 -> 1), each
`and`/`or` swapped, each `not` and unary minus dropped, each function-call keyword argument
dropped. A mutant is killed when a test function raises (or the module fails to load).
"""
import ast, copy, importlib, sys, types, traceback

path, modname, tests = sys.argv[1], sys.argv[2], sys.argv[3:]
src = open(path).read()
tree = ast.parse(src)

CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
       ast.NotEq: ast.Eq}
BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
       ast.FloorDiv: ast.Div}

def sites(tree):
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Compare):
      for i, op in enumerate(node.ops):
        if type(op) in CMP:
          out.append(('cmp', node, i))
    elif isinstance(node, ast.BinOp) and type(node.op) in BIN:
      out.append(('bin', node, None))
    elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
      out.append(('const+1', node, None)); out.append(('const0', node, None))
    elif isinstance(node, ast.BoolOp):
      out.append(('boolop', node, None))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
      out.append(('unary', node, None))
    elif isinstance(node, ast.Call):
      for i, _ in enumerate(node.keywords):
        out.append(('kwdrop', node, i))
  return out

import os
_ranges = [tuple(int(x) for x in r.split('-')) for r in os.environ.get('LINES', '').split(',') if r]
_skip = [k for k in os.environ.get('SKIP_TESTS', '').split(',') if k]
def _in_range(node):
  ln = getattr(node, 'lineno', None)
  return not _ranges or (ln is not None and any(a <= ln <= b for a, b in _ranges))
_sites = sites
def sites(tree):
  return [s for s in _sites(tree) if _in_range(s[1])]
base_sites = sites(tree)
print(len(base_sites), 'mutants')

def mutate(k):
  t = copy.deepcopy(tree)
  s = sites(t)[k]
  kind, node, i = s
  if kind == 'cmp': node.ops[i] = CMP[type(node.ops[i])]()
  elif kind == 'bin': node.op = BIN[type(node.op)]()
  elif kind == 'const+1': node.value = node.value + 1
  elif kind == 'const0': node.value = 0 if node.value != 0 else 1
  elif kind == 'boolop': node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
  elif kind == 'unary':
    return t, node, kind
  elif kind == 'kwdrop': del node.keywords[i]
  return t, node, kind

class Unary(ast.NodeTransformer):
  def __init__(self, target): self.target = target
  def visit_UnaryOp(self, node):
    self.generic_visit(node)
    return node.operand if node is self.target else node

test_mods = [importlib.import_module(t) for t in tests]
orig = importlib.import_module(modname)
dependents = [m for m in list(sys.modules.values()) if m is not None and getattr(m, '__name__', '').startswith('fl_privacy') and any(v is orig for v in vars(m).values())]

def run_tests():
  for tm in test_mods:
    for name in dir(tm):
      if name.startswith('test_') and not any(k in name for k in _skip):
        fn = getattr(tm, name)
        import inspect
        if inspect.signature(fn).parameters:
          continue
        fn()

run_tests()  # the unmutated module passes
survivors = []
killed = 0
for k in range(len(base_sites)):
  t, node, kind = mutate(k)
  if kind == 'unary':
    t = Unary(node).visit(t)
  ast.fix_missing_locations(t)
  m = types.ModuleType(modname)
  m.__file__ = path
  try:
    exec(compile(t, path, 'exec'), m.__dict__)
  except Exception:
    killed += 1; continue
  patched = []
  for d in dependents + test_mods:
    for key, v in list(vars(d).items()):
      if v is orig:
        setattr(d, key, m); patched.append((d, key))
  try:
    run_tests()
    survivors.append((k, kind, getattr(node, 'lineno', '?'), ast.unparse(node) if hasattr(ast, 'unparse') else ''))
  except (Exception, BaseException) as e:  # pytest's Failed is a BaseException
    if isinstance(e, KeyboardInterrupt):
      raise
    killed += 1
  finally:
    for d, key in patched:
      setattr(d, key, orig)
print(f'killed {killed} / {len(base_sites)}')
for s in survivors:
  print('SURVIVED', s)
