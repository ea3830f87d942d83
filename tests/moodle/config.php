<?php
// Moodle config.php for the real-Moodle suite: one install serves every node, so
// everything that differs per node or per run comes from the environment that
// tests/real_moodle/site.rs gives each `php -S` (and each CLI script).
//
//   MOODLE_WWWROOT          the gateway's public URL, the same on every node
//   MOODLE_DATAROOT         the shared dataroot (files, shared sessions, MUC)
//   MOODLE_DBSOCKET         the private MariaDB's socket (MOODLE_DBPORT: its port)
//   MOODLE_SESSIONS         "shared": file sessions in the shared dataroot;
//                           "node-local": file sessions in MOODLE_SESSION_DIR
//   MOODLE_NODE             the node's name, sent back as X-Moodle-Node (prepend.php)
//   MOODLE_LOCALCACHEDIR    this node's localcachedir (theme CSS, JS: never shared)
//   MOODLE_LOCALREQUESTDIR  this node's localrequestdir (created here: a missing
//                           one disables X-Accel-Redirect in this build)
//   MOODLE_XSENDFILE        "X-Accel-Redirect": the offload mode. Files are answered
//                           with that header naming /dataroot/filedir/xx/yy/<hash>
//                           and an empty body; the gateway fetches the bytes from
//                           the data server's file export (tests/moodle/nginx-export.conf)
unset($CFG);
global $CFG;
$CFG = new stdClass();

function moodle_suite_env(string $name, ?string $default = null): string {
    $value = getenv($name);
    if ($value === false || $value === '') {
        if ($default === null) {
            fwrite(STDERR, "config.php: $name is not set\n");
            http_response_code(500);
            exit(1);
        }
        return $default;
    }
    return $value;
}

$CFG->dbtype    = 'mariadb';
$CFG->dblibrary = 'native';
$CFG->dbhost    = 'localhost';
$CFG->dbname    = 'moodle';
$CFG->dbuser    = 'root';
$CFG->dbpass    = '';
$CFG->prefix    = 'mdl_';
$CFG->dboptions = [
    'dbpersist' => 0,
    'dbsocket'  => moodle_suite_env('MOODLE_DBSOCKET'),
    'dbport'    => moodle_suite_env('MOODLE_DBPORT', ''),
    'dbcollation' => 'utf8mb4_unicode_ci',
];

$CFG->wwwroot  = moodle_suite_env('MOODLE_WWWROOT');
$CFG->dataroot = moodle_suite_env('MOODLE_DATAROOT');
$CFG->admin    = 'admin';
$CFG->directorypermissions = 02777;

$node = moodle_suite_env('MOODLE_NODE', 'cli');
$CFG->localcachedir = moodle_suite_env('MOODLE_LOCALCACHEDIR', $CFG->dataroot . '/localcache-' . $node);
$CFG->localrequestdir = moodle_suite_env('MOODLE_LOCALREQUESTDIR', sys_get_temp_dir() . '/requestdir-' . $node);
if (!is_dir($CFG->localrequestdir)) {
    @mkdir($CFG->localrequestdir, 0777, true);
}

switch (moodle_suite_env('MOODLE_XSENDFILE', 'off')) {
    case 'off':
        break;
    case 'X-Accel-Redirect':
        $CFG->xsendfile = 'X-Accel-Redirect';
        // The gateway's [offload] prefix: the key; the export serves what lies below it.
        $CFG->xsendfilealiases = ['/dataroot/' => $CFG->dataroot];
        break;
    default:
        fwrite(STDERR, "config.php: MOODLE_XSENDFILE must be off or X-Accel-Redirect\n");
        exit(1);
}

$themerev = getenv('MOODLE_THEMEREV');
if ($themerev !== false && $themerev !== '') {
    $CFG->themerev = (int) $themerev;
}

$CFG->session_handler_class = '\core\session\file';
switch (moodle_suite_env('MOODLE_SESSIONS', 'shared')) {
    case 'shared':
        // The file handler's default: $CFG->dataroot/sessions, which every node shares.
        break;
    case 'node-local':
        $CFG->session_file_save_path = moodle_suite_env('MOODLE_SESSION_DIR');
        break;
    default:
        fwrite(STDERR, "config.php: MOODLE_SESSIONS must be shared or node-local\n");
        exit(1);
}

// A scripted browser: no password rules, no tours, no mail, no outside calls.
$CFG->passwordpolicy = 0;
$CFG->noemailever = true;
$CFG->disableupdatenotifications = true;
$CFG->disableupdateautodeploy = true;

// The key is made at install (generate.php): made on first use, it races.
$CFG->nokeygeneration = true;

// Exceptions into the node's log (php -S's stderr: php.log in its scratch directory)
// with Moodle's debug info, never onto the page: DEBUG_MINIMAL is E_ERROR | E_PARSE.
$CFG->debug = 5;
$CFG->debugdisplay = 0;

require_once(__DIR__ . '/lib/setup.php');
