# The python program of scripts/capture-programs.sh: the python corpus's program's work
# (CPython 3.11 holding the parsed Debian package index, dependency maps, a word counter, a
# JSON dump and parsed AppStream YAML), done as a long-running index service would: the index refreshed one list at a time,
# dependency closures answered with a bounded cache, the word counter kept up to date,
# a JSON dump rebuilt now and then. Runs until the file named by its argument exists.
import collections, gzip, json, os, random, re, subprocess, sys, time, yaml

LISTS = "/var/lib/apt/lists"
pkg_files = sorted(f for f in os.listdir(LISTS) if f.endswith("_Packages.lz4"))
yml = [f for f in os.listdir(LISTS) if f.endswith(".yml.gz")]
rng = random.Random(61)

def parse(name):
    raw = subprocess.run(["lz4", "-dc", os.path.join(LISTS, name)], capture_output=True, check=True).stdout.decode()
    pkgs = {}
    for stanza in raw.split("\n\n"):
        fields, key = {}, None
        for line in stanza.split("\n"):
            if line.startswith(" ") and key:
                fields[key] += "\n" + line[1:]
            elif ":" in line:
                key, _, val = line.partition(":")
                fields[key] = val.strip()
        if "Package" in fields:
            pkgs[fields["Package"]] = fields
    return pkgs

def deps_of(fields):
    out = []
    for f in ("Depends", "Pre-Depends", "Recommends"):
        for alt in fields.get(f, "").split(","):
            name = alt.split("|")[0].strip().split(" ")[0].split(":")[0]
            if name:
                out.append(name)
    return out

index = {n: parse(n) for n in pkg_files}
def maps():
    fwd, rev = {}, collections.defaultdict(set)
    for pkgs in index.values():
        for name, fields in pkgs.items():
            d = deps_of(fields)
            fwd[name] = d
            for x in d:
                rev[x].add(name)
    return fwd, rev
fwd, rev = maps()
words = collections.Counter()
for pkgs in index.values():
    for fields in pkgs.values():
        words.update(re.findall(r"[a-z]{3,}", fields.get("Description", "").lower()))
appstream = []
for y in yml:
    with gzip.open(os.path.join(LISTS, y), "rt") as f:
        for doc in yaml.load_all(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            appstream.append(doc)
            if len(appstream) > 6000:
                break
cache = collections.OrderedDict()
def closure(name):
    if name in cache:
        cache.move_to_end(name)
        return cache[name]
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(fwd.get(n, ()))
    cache[name] = sorted(seen)
    if len(cache) > 20000:
        cache.popitem(last=False)
    return cache[name]

names = sorted(fwd)
dump = None
start = time.time()
round_ = 0
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    round_ += 1
    t = time.time() - start
    # queries for a minute, over a hot set that drifts through the package names
    centre = int((t / 600.0) * len(names)) % len(names)
    until = time.time() + 60
    while time.time() < until:
        i = (centre + int(rng.gauss(0, 800))) % len(names)
        closure(names[i])
        rev.get(names[i])
    # refresh one list (the index's pages change), rebuild the maps
    n = pkg_files[round_ % len(pkg_files)]
    index[n] = parse(n)
    fwd, rev = maps()
    names = sorted(fwd)
    for fields in index[n].values():
        words.update(re.findall(r"[a-z]{3,}", fields.get("Description", "").lower()))
    # every third round a new JSON dump of the most asked-for closures
    if round_ % 3 == 0:
        dump = json.dumps({k: v for k, v in list(cache.items())[-5000:]})
