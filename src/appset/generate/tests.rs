//! The generators on plain facts: each kind, the combinations, and the
//! validation `needs` and `generate` share.

use super::*;
use serde_json::json;

fn generator(value: Value) -> Generator {
    serde_json::from_value(value).unwrap()
}

fn generators(values: Vec<Value>) -> Vec<Generator> {
    values.into_iter().map(generator).collect()
}

fn tree(paths: &[(&str, &str)]) -> GitTree {
    GitTree {
        commit: "abc".to_owned(),
        files: paths
            .iter()
            .map(|(path, contents)| SourceFile {
                path: path.to_string(),
                contents: contents.as_bytes().to_vec(),
            })
            .collect(),
    }
}

const REPO: &str = "https://git.example.com/org/fleet.git";

fn git_facts(paths: &[(&str, &str)]) -> Facts {
    Facts {
        git: BTreeMap::from([((REPO.to_owned(), "main".to_owned()), tree(paths))]),
        ..Default::default()
    }
}

fn directories(patterns: Value) -> Vec<Generator> {
    generators(vec![
        json!({"git": {"repoURL": REPO, "revision": "main", "directories": patterns}}),
    ])
}

fn files(patterns: Value) -> Vec<Generator> {
    generators(vec![
        json!({"git": {"repoURL": REPO, "revision": "main", "files": patterns}}),
    ])
}

fn paths(sets: &[Params]) -> Vec<&str> {
    sets.iter().map(|set| set["path"].as_str()).collect()
}

fn invalid_at(result: Result<impl fmt::Debug, GenerateError>) -> (String, String) {
    match result {
        Err(GenerateError::Invalid { at, reason }) => (at, reason),
        other => panic!("expected an invalid generator, got {other:?}"),
    }
}

#[test]
fn list_elements_are_flattened() {
    let g = generators(vec![json!({"list": {"elements": [
        {"cluster": "eu", "values": {"replicas": 2}},
        {"cluster": "us"}
    ]}})]);
    let sets = generate(&g, &Facts::default()).unwrap();
    assert_eq!(sets.len(), 2);
    assert_eq!(sets[0]["values.replicas"], "2");
    assert_eq!(sets[1]["cluster"], "us");
    assert!(needs(&g).unwrap().is_empty());

    let bad = generators(vec![json!({"list": {"elements": [{"a": 1}, "b"]}})]);
    let (at, _) = invalid_at(generate(&bad, &Facts::default()));
    assert_eq!(at, "generators[0].list.elements[1]");
}

#[test]
fn directories_match_one_segment_minus_excludes() {
    let facts = git_facts(&[
        ("apps/web/deploy.yaml", ""),
        ("apps/api/deploy.yaml", ""),
        ("apps/api/base/kustomization.yaml", ""),
        ("apps/legacy/deploy.yaml", ""),
        ("README.md", ""),
    ]);
    let g = directories(json!([{"path": "apps/*"}, {"path": "apps/legacy", "exclude": true}]));
    let sets = generate(&g, &facts).unwrap();
    assert_eq!(paths(&sets), ["apps/api", "apps/web"]);
    assert_eq!(sets[1]["path.basename"], "web");
    assert_eq!(sets[1]["path[0]"], "apps");
}

#[test]
fn double_star_crosses_segments() {
    let facts = git_facts(&[("envs/eu/prod/a.yaml", ""), ("envs/us/b.yaml", "")]);
    let sets = generate(&directories(json!([{"path": "envs/**"}])), &facts).unwrap();
    assert_eq!(paths(&sets), ["envs/eu", "envs/eu/prod", "envs/us"]);
}

#[test]
fn hidden_directories_only_when_named() {
    let facts = git_facts(&[
        ("apps/.cache/x.yaml", ""),
        ("apps/web/x.yaml", ""),
        (".github/workflows/ci.yaml", ""),
    ]);
    let all = generate(
        &directories(json!([{"path": "*"}, {"path": "apps/*"}])),
        &facts,
    )
    .unwrap();
    assert_eq!(paths(&all), ["apps", "apps/web"]);
    let named = generate(&directories(json!([{"path": ".github/*"}])), &facts).unwrap();
    assert_eq!(paths(&named), [".github/workflows"]);
}

#[test]
fn files_yield_their_keys_and_path() {
    let facts = git_facts(&[
        (
            "clusters/eu/config.yaml",
            "cluster:\n  name: eu\n  replicas: 3\npath.filename: mine\n",
        ),
        (
            "clusters/us/config.json",
            r#"[{"cluster": {"name": "us-1"}}, {"cluster": {"name": "us-2"}}]"#,
        ),
        ("clusters/us/notes.txt", "not matched"),
    ]);
    let g = files(json!([{"path": "clusters/*/config.*"}]));
    let sets = generate(&g, &facts).unwrap();
    assert_eq!(sets.len(), 3);
    assert_eq!(sets[0]["cluster.name"], "eu");
    assert_eq!(sets[0]["cluster.replicas"], "3");
    assert_eq!(sets[0]["path"], "clusters/eu");
    assert_eq!(sets[0]["path.basename"], "eu");
    // The file's own key wins over the path parameter.
    assert_eq!(sets[0]["path.filename"], "mine");
    assert_eq!(sets[1]["cluster.name"], "us-1");
    assert_eq!(sets[2]["cluster.name"], "us-2");
    assert_eq!(sets[2]["path.filename"], "config.json");
}

#[test]
fn a_broken_file_is_named() {
    for (contents, expected) in [
        ("a: [1, 2", "not YAML"),
        ("just a string", "a string"),
        ("- a: 1\n- 2\n", "element 1"),
    ] {
        let facts = git_facts(&[("config/a.yaml", "x: 1"), ("config/b.yaml", contents)]);
        match generate(&files(json!([{"path": "config/*.yaml"}])), &facts) {
            Err(GenerateError::BadFile { path, reason }) => {
                assert_eq!(path, "config/b.yaml");
                assert!(reason.contains(expected), "{reason}");
            }
            other => panic!("expected a bad file, got {other:?}"),
        }
    }
}

#[test]
fn a_yaml_bomb_is_refused_before_it_expands() {
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 0..7 {
        let previous = if level == 0 {
            "a".to_owned()
        } else {
            format!("l{}", level - 1)
        };
        bomb.push_str(&format!(
            "l{level}: &l{level} [{}]\n",
            vec![format!("*{previous}"); 10].join(", ")
        ));
    }
    let facts = git_facts(&[("config/bomb.yaml", &bomb)]);
    assert!(matches!(
        generate(&files(json!([{"path": "config/*.yaml"}])), &facts),
        Err(GenerateError::BadFile { .. })
    ));
}

fn cluster(name: &str, labels: &[(&str, &str)]) -> ClusterFact {
    ClusterFact {
        name: name.to_owned(),
        server: format!("https://{name}.example.com"),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        annotations: BTreeMap::from([("owner".to_owned(), "ops".to_owned())]),
    }
}

#[test]
fn clusters_by_labels_and_expressions() {
    let facts = Facts {
        clusters: vec![
            cluster("Prod_EU", &[("env", "prod"), ("region", "eu")]),
            cluster(
                "prod-us",
                &[("env", "prod"), ("region", "us"), ("frozen", "yes")],
            ),
            cluster("staging", &[("env", "staging"), ("region", "eu")]),
            cluster("dev", &[("env", "dev")]),
        ],
        ..Default::default()
    };
    let names = |selector: Value| -> Vec<String> {
        let g = generators(vec![
            json!({"clusters": {"selector": selector, "values": {"tier": "1"}}}),
        ]);
        generate(&g, &facts)
            .unwrap()
            .into_iter()
            .map(|s| s["name"].clone())
            .collect()
    };
    assert_eq!(
        names(json!({"matchLabels": {"env": "prod"}})),
        ["Prod_EU", "prod-us"]
    );
    assert_eq!(
        names(json!({"matchExpressions": [{"key": "region", "operator": "In", "values": ["eu"]}]})),
        ["Prod_EU", "staging"]
    );
    assert_eq!(
        names(
            json!({"matchExpressions": [{"key": "region", "operator": "NotIn", "values": ["eu"]}]})
        ),
        ["dev", "prod-us"]
    );
    assert_eq!(
        names(
            json!({"matchLabels": {"env": "prod"}, "matchExpressions": [{"key": "frozen", "operator": "DoesNotExist"}]})
        ),
        ["Prod_EU"]
    );
    assert_eq!(
        names(json!({"matchExpressions": [{"key": "frozen", "operator": "Exists"}]})),
        ["prod-us"]
    );

    let g = generators(vec![
        json!({"clusters": {"selector": {"matchLabels": {"region": "eu", "env": "prod"}}, "values": {"tier": "1"}}}),
    ]);
    let set = &generate(&g, &facts).unwrap()[0];
    assert_eq!(set["nameNormalized"], "prod-eu");
    assert_eq!(set["server"], "https://Prod_EU.example.com");
    assert_eq!(set["metadata.labels.region"], "eu");
    assert_eq!(set["metadata.annotations.owner"], "ops");
    assert_eq!(set["values.tier"], "1");
    assert_eq!(needs(&g).unwrap(), [Need::Clusters]);

    let bad = generators(vec![
        json!({"clusters": {"selector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}}}),
    ]);
    let (at, reason) = invalid_at(needs(&bad));
    assert_eq!(at, "generators[0].clusters.selector.matchExpressions[0]");
    assert!(reason.contains("\"Gt\""), "{reason}");
}

fn pull(number: u64, branch: &str, target: &str, labels: &[&str]) -> PullFact {
    PullFact {
        number,
        branch: branch.to_owned(),
        target_branch: target.to_owned(),
        head_sha: "0123456789abcdef0123".to_owned(),
        labels: labels.iter().map(|l| l.to_string()).collect(),
    }
}

fn github() -> PullSource {
    PullSource::GitHub {
        owner: "org".to_owned(),
        repo: "shop".to_owned(),
    }
}

#[test]
fn pull_requests_by_labels_and_filters() {
    let facts = Facts {
        pulls: BTreeMap::from([(
            github(),
            vec![
                pull(12, "feature/Login_Page", "main", &["preview", "ui"]),
                pull(7, "fix/typo", "main", &["preview"]),
                pull(9, "feature/old", "release-1", &["preview"]),
                pull(3, "feature/unlabelled", "main", &[]),
            ],
        )]),
        ..Default::default()
    };
    let g = generators(vec![json!({"pullRequest": {
        "github": {"owner": "org", "repo": "shop", "labels": ["preview"]},
        "filters": [
            {"branchMatch": "^feature/", "targetBranchMatch": "^main$"},
            {"branchMatch": "^fix/"}
        ]
    }})]);
    assert_eq!(needs(&g).unwrap(), [Need::Pulls(github())]);
    let sets = generate(&g, &facts).unwrap();
    let numbers: Vec<&str> = sets.iter().map(|s| s["number"].as_str()).collect();
    assert_eq!(numbers, ["7", "12"]);
    let set = &sets[1];
    assert_eq!(set["branch"], "feature/Login_Page");
    assert_eq!(set["branch_slug"], "feature-login-page");
    assert_eq!(set["target_branch_slug"], "main");
    assert_eq!(set["head_short_sha"], "01234567");
    assert_eq!(set["head_short_sha_7"], "0123456");
    assert_eq!(set["labels"], "preview,ui");

    let unfiltered = generators(vec![
        json!({"pullRequest": {"github": {"owner": "org", "repo": "shop"}}}),
    ]);
    assert_eq!(generate(&unfiltered, &facts).unwrap().len(), 4);
}

#[test]
fn missing_pull_facts_are_a_bug_not_an_empty_list() {
    let g = generators(vec![
        json!({"pullRequest": {"gitlab": {"project": "group/shop"}}}),
    ]);
    assert!(matches!(
        generate(&g, &Facts::default()),
        Err(GenerateError::MissingFacts { .. })
    ));
    let mut facts = Facts::default();
    facts.pulls.insert(
        PullSource::GitLab {
            project: "group/shop".to_owned(),
        },
        vec![],
    );
    assert!(generate(&g, &facts).unwrap().is_empty());
}

#[test]
fn pull_request_generators_are_validated() {
    let both = generators(vec![
        json!({"pullRequest": {"github": {"owner": "o", "repo": "r"}, "gitlab": {"project": "p"}}}),
    ]);
    assert_eq!(invalid_at(needs(&both)).0, "generators[0].pullRequest");
    let regex = generators(vec![
        json!({"pullRequest": {"github": {"owner": "o", "repo": "r"}, "filters": [{"branchMatch": "feature/("}]}}),
    ]);
    assert_eq!(
        invalid_at(needs(&regex)).0,
        "generators[0].pullRequest.filters[0].branchMatch"
    );
}

#[test]
fn slugs_follow_argo_cd() {
    assert_eq!(slug("Feature/ABC--_x_"), "feature-abc-x");
    assert_eq!(slug("--a"), "a");
    let long = format!("{}-{}", "a".repeat(45), "b".repeat(10));
    assert_eq!(slug(&long), "a".repeat(45));
    assert_eq!(slug(&"c".repeat(60)), "c".repeat(50));
    let exact = format!("{}-{}", "d".repeat(50), "e");
    assert_eq!(slug(&exact), "d".repeat(50));
}

#[test]
fn matrix_is_the_product_and_refuses_conflicts() {
    let g = generators(vec![json!({"matrix": {"generators": [
        {"list": {"elements": [{"cluster": "eu"}, {"cluster": "us"}]}},
        {"list": {"elements": [{"app": "web", "team": "shop"}, {"app": "api", "team": "shop"}]}}
    ]}})]);
    let sets = generate(&g, &Facts::default()).unwrap();
    let pairs: Vec<(String, String)> = sets
        .iter()
        .map(|s| (s["cluster"].clone(), s["app"].clone()))
        .collect();
    assert_eq!(
        pairs,
        [("eu", "web"), ("eu", "api"), ("us", "web"), ("us", "api")]
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );

    let same = generators(vec![json!({"matrix": {"generators": [
        {"list": {"elements": [{"team": "shop", "a": "1"}]}},
        {"list": {"elements": [{"team": "shop", "b": "2"}]}}
    ]}})]);
    assert_eq!(generate(&same, &Facts::default()).unwrap().len(), 1);

    let conflict = generators(vec![json!({"matrix": {"generators": [
        {"list": {"elements": [{"team": "shop"}]}},
        {"list": {"elements": [{"team": "ops"}]}}
    ]}})]);
    match generate(&conflict, &Facts::default()) {
        Err(GenerateError::Conflict { key, left, right }) => {
            assert_eq!(
                (key.as_str(), left.as_str(), right.as_str()),
                ("team", "shop", "ops")
            );
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[test]
fn a_huge_matrix_is_refused() {
    let elements: Vec<Value> = (0..101).map(|i| json!({ "i": i })).collect();
    let others: Vec<Value> = (0..100).map(|j| json!({ "j": j })).collect();
    let g = generators(vec![json!({"matrix": {"generators": [
        {"list": {"elements": elements}}, {"list": {"elements": others}}
    ]}})]);
    assert!(matches!(
        generate(&g, &Facts::default()),
        Err(GenerateError::TooMany { count: 10_100, .. })
    ));
}

#[test]
fn merge_updates_base_sets_by_merge_keys() {
    let g = generators(vec![
        json!({"merge": {"mergeKeys": ["cluster"], "generators": [
            {"list": {"elements": [
                {"cluster": "eu", "replicas": "1"},
                {"cluster": "us", "replicas": "1"}
            ]}},
            {"list": {"elements": [
                {"cluster": "us", "replicas": "3", "canary": "true"},
                {"cluster": "asia", "replicas": "9"}
            ]}},
            {"list": {"elements": [{"cluster": "eu", "region": "west"}, {"other": "x"}]}}
        ]}}),
    ]);
    let sets = generate(&g, &Facts::default()).unwrap();
    assert_eq!(sets.len(), 2);
    assert_eq!(sets[0]["cluster"], "eu");
    assert_eq!(sets[0]["replicas"], "1");
    assert_eq!(sets[0]["region"], "west");
    assert_eq!(sets[1]["replicas"], "3");
    assert_eq!(sets[1]["canary"], "true");

    let missing = generators(vec![
        json!({"merge": {"mergeKeys": ["cluster"], "generators": [
            {"list": {"elements": [{"name": "eu"}]}}, {"list": {"elements": []}}
        ]}}),
    ]);
    let (at, reason) = invalid_at(generate(&missing, &Facts::default()));
    assert_eq!(at, "generators[0].merge");
    assert!(reason.contains("\"cluster\""), "{reason}");

    let no_keys = generators(vec![json!({"merge": {"generators": [
        {"list": {"elements": []}}, {"list": {"elements": []}}
    ]}})]);
    assert!(invalid_at(needs(&no_keys)).1.contains("mergeKeys"));

    let twice = generators(vec![json!({"merge": {"mergeKeys": ["c"], "generators": [
        {"list": {"elements": [{"c": "eu"}]}},
        {"list": {"elements": [{"c": "eu", "x": "1"}, {"c": "eu", "x": "2"}]}}
    ]}})]);
    assert_eq!(
        invalid_at(generate(&twice, &Facts::default())).0,
        "generators[0].merge.generators[1]"
    );
}

#[test]
fn identical_sets_of_two_generators_are_one() {
    let g = generators(vec![
        json!({"list": {"elements": [{"a": "1"}, {"a": "2"}]}}),
        json!({"list": {"elements": [{"a": "2"}, {"a": "3"}]}}),
    ]);
    let sets = generate(&g, &Facts::default()).unwrap();
    let values: Vec<&str> = sets.iter().map(|s| s["a"].as_str()).collect();
    assert_eq!(values, ["1", "2", "3"]);
}

#[test]
fn needs_merge_prefixes_per_repository_and_revision() {
    let g = generators(vec![
        json!({"git": {"repoURL": REPO, "revision": "main", "directories": [
            {"path": "apps/*"}, {"path": "apps/team/*"}, {"path": "infra/base"},
            {"path": "apps/legacy", "exclude": true}
        ]}}),
        json!({"matrix": {"generators": [
            {"git": {"repoURL": REPO, "revision": "main", "credentialsSecret": "fleet-creds",
                     "files": [{"path": "clusters/**/config.json"}, {"path": "config.yaml"}]}},
            {"git": {"repoURL": REPO, "directories": [{"path": "*/deploy"}]}}
        ]}}),
    ]);
    assert_eq!(
        needs(&g).unwrap(),
        [
            Need::Git(GitNeed {
                repo_url: REPO.to_owned(),
                revision: String::new(),
                credentials_secret: None,
                prefixes: vec![String::new()],
            }),
            Need::Git(GitNeed {
                repo_url: REPO.to_owned(),
                revision: "main".to_owned(),
                credentials_secret: Some("fleet-creds".to_owned()),
                prefixes: vec![String::new()],
            }),
        ]
    );

    let narrow = generators(vec![
        json!({"git": {"repoURL": REPO, "directories": [{"path": "apps/*"}, {"path": "apps/team/*"}, {"path": "infra/base"}]}}),
        json!({"git": {"repoURL": REPO, "files": [{"path": "clusters/**/config.json"}]}}),
    ]);
    let found: [Need; 1] = needs(&narrow).unwrap().try_into().unwrap();
    let [Need::Git(need)] = found else {
        panic!("expected one git need");
    };
    assert_eq!(need.prefixes, ["apps", "clusters", "infra/base"]);
}

#[test]
fn invalid_generators_are_refused_with_their_place() {
    let two = generators(vec![
        json!({"list": {"elements": []}}),
        json!({"list": {"elements": []}, "clusters": {}}),
    ]);
    let (at, reason) = invalid_at(needs(&two));
    assert_eq!(at, "generators[1]");
    assert!(reason.contains("list and clusters"), "{reason}");

    let nested_two = generators(vec![json!({"matrix": {"generators": [
        {"list": {"elements": []}},
        {"list": {"elements": []}, "git": {"repoURL": REPO, "directories": [{"path": "*"}]}}
    ]}})]);
    assert_eq!(
        invalid_at(needs(&nested_two)).0,
        "generators[0].matrix.generators[1]"
    );

    let typo = generators(vec![json!({"matrix": {"generators": [
        {"lists": {"elements": []}}, {"list": {"elements": []}}
    ]}})]);
    let (at, reason) = invalid_at(needs(&typo));
    assert_eq!(at, "generators[0].matrix.generators[0]");
    assert!(reason.contains("\"lists\""), "{reason}");

    let three = generators(vec![json!({"matrix": {"generators": [
        {"list": {"elements": []}}, {"list": {"elements": []}}, {"list": {"elements": []}}
    ]}})]);
    assert_eq!(invalid_at(needs(&three)).0, "generators[0].matrix");

    let empty = generators(vec![json!({})]);
    assert_eq!(invalid_at(needs(&empty)).0, "generators[0]");

    let glob = directories(json!([{"path": "apps/[a"}]));
    assert_eq!(
        invalid_at(needs(&glob)).0,
        "generators[0].git.directories[0]"
    );
}

#[test]
fn nesting_is_limited() {
    let list = json!({"list": {"elements": [{"a": "1"}]}});
    let other = json!({"list": {"elements": [{"b": "1"}]}});
    let wrap = |inner: Value| json!({"matrix": {"generators": [inner, other.clone()]}});
    let three = wrap(wrap(wrap(list.clone())));
    assert_eq!(
        generate(&generators(vec![three.clone()]), &Facts::default())
            .unwrap()
            .len(),
        1
    );
    let four = generators(vec![wrap(three)]);
    let (at, reason) = invalid_at(needs(&four));
    assert_eq!(
        at,
        "generators[0].matrix.generators[0].matrix.generators[0].matrix.generators[0].matrix"
    );
    assert!(reason.contains("at most 3"), "{reason}");
}

#[test]
fn missing_git_facts_are_a_bug() {
    let g = directories(json!([{"path": "apps/*"}]));
    assert!(matches!(
        generate(&g, &Facts::default()),
        Err(GenerateError::MissingFacts { .. })
    ));
}
