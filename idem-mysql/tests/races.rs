//! Real concurrency over several pools ("several processes"), under both
//! InnoDB isolation levels an application runs (`REPEATABLE READ`, the
//! default, with its gap locks, and `READ COMMITTED`) and with both claim
//! paths: the SQL suite's races (`idem_test_support::sql::races`).

mod support;

mod repeatable_read_mariadb {
    use crate::support::{MySql, RR};
    use idem_mysql::Server;
    idem_test_support::sql_suite!(MySql::at(Server::MariaDb, RR); @races);
    idem_test_support::sql_suite!(MySql::at(Server::MariaDb, RR); transactional_racers_with_rollbacks);
}

mod read_committed_mariadb {
    use crate::support::{MySql, RC};
    use idem_mysql::Server;
    idem_test_support::sql_suite!(MySql::at(Server::MariaDb, RC); @races);
    idem_test_support::sql_suite!(MySql::at(Server::MariaDb, RC); transactional_racers_with_rollbacks);
}

mod repeatable_read_mysql_path {
    use crate::support::{MySql, RR};
    use idem_mysql::Server;
    idem_test_support::sql_suite!(MySql::at(Server::MySql, RR); @races);
    idem_test_support::sql_suite!(MySql::at(Server::MySql, RR); transactional_racers_with_rollbacks);
}

mod read_committed_mysql_path {
    use crate::support::{MySql, RC};
    use idem_mysql::Server;
    idem_test_support::sql_suite!(MySql::at(Server::MySql, RC); @races);
    idem_test_support::sql_suite!(MySql::at(Server::MySql, RC); transactional_racers_with_rollbacks);
}
