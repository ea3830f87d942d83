<?php
// auto_prepend_file of every `php -S` node in the real-Moodle suite.
//
// 1. Moodle compares the port of $CFG->wwwroot (the gateway's) with
//    $_SERVER['SERVER_PORT'] (initialise_fullme() in lib/setuplib.php) and
//    redirects when they differ. PHP's built-in server reports its own listening
//    port, so a node behind the gateway would loop in redirects; Apache with
//    UseCanonicalName Off takes the port from Host, and so do we (unless
//    MOODLE_OWN_PORT is set).
// 2. X-Moodle-Node names the node that ran the script, so the tests see where each
//    request was served (plain files are served by php -S without PHP: no header).
// 3. With MOODLE_REQUEST_LOG set, each script appends "<microseconds> <URI>" to that
//    file when it ends: how long it held its php -S worker (the offload measure). The
//    handler registers itself again from inside the shutdown, so it runs after
//    Moodle's own (the session write included).
if (PHP_SAPI === 'cli-server') {
    $host = $_SERVER['HTTP_HOST'] ?? '';
    // MOODLE_OWN_PORT: PHP keeps its own port, as behind a web server that was
    // not told wwwroot's (the doctor's low-priority pool check).
    if (getenv('MOODLE_OWN_PORT') === false) {
        $_SERVER['SERVER_PORT'] = preg_match('/:(\d+)$/', $host, $m) ? $m[1] : '80';
    }
    $node = getenv('MOODLE_NODE');
    if ($node !== false && $node !== '') {
        header('X-Moodle-Node: ' . $node);
    }
    // In a closure: no global of ours for a Moodle script to trip over.
    (function () {
        $log = getenv('MOODLE_REQUEST_LOG');
        if ($log === false || $log === '') {
            return;
        }
        $started = hrtime(true);
        register_shutdown_function(function () use ($log, $started) {
            register_shutdown_function(function () use ($log, $started) {
                $elapsed = intdiv(hrtime(true) - $started, 1000);
                $uri = $_SERVER['REQUEST_URI'] ?? '-';
                file_put_contents($log, "$elapsed $uri\n", FILE_APPEND | LOCK_EX);
            });
        });
    })();
}
